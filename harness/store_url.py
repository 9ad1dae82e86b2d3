"""A store's connection string as zobench shows it: every form of a password libpq takes removed,
so no message, run.json or pushed row holds one. Its own module because every command that
records its command line needs it, and the shared store's driver is not needed for that."""
from __future__ import annotations

import re
from urllib.parse import quote, unquote, urlsplit, urlunsplit

# a password in a key=value connection string: password=x, password = 'x y', password='it\\'s'
PASSWORD_KV = re.compile(r"""(?i)(^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S*)""")
# what stands for a password scrub() took out
HIDDEN = "***"
# a URL's user:password@ in any text, whether or not the URL parses: from the scheme to the last
# @ before the next space or quote (userinfo()'s rule: a password may hold an @ of its own)
URL_PASSWORD = re.compile(r"(?i)(postgres(?:ql)?://[^:@/\s'\"]*):[^\s'\"]*@")
# the passwords of every store URL this process has been given (known()): what scrub() removes
_SECRETS: set[str] = set()


def userinfo(url: str) -> tuple[str, str | None, str]:
    """A URL cut where libpq's rule puts its user info: (scheme://, the user info or None, the
    rest from the host on). The user info is everything between '://' and the LAST '@': a
    password may hold '?', '#', '/' or '@' unescaped, which a URL parser reads as the query,
    fragment, path or host (and then shows the password as such). The one home of the rule:
    shown(), passwords() and scrub() all cut here; an '@' in a query makes the host hidden too,
    which errs on the side of the secret."""
    head, sep, tail = url.partition("://")
    info, at, rest = tail.rpartition("@")
    return head + sep, (info if at else None), (rest if at else tail)


def shown(url: str) -> str:
    """The connection string without its password, in any form libpq takes it (user:password@,
    ?password= in a URL, password= in a key=value string), for a message, run.json or the
    store (a password belongs in ~/.pgpass or $PGPASSWORD, never on a line zobench prints or a
    file it writes). Never fails: it cuts the text by userinfo()'s rule, parsing nothing."""
    if "://" not in url:
        return " ".join(PASSWORD_KV.sub(r"\1", url).split())
    scheme, info, rest = userinfo(url)
    where, q, query = rest.partition("?")
    query, hash_, fragment = query.partition("#")
    kept = "&".join(p for p in query.split("&") if p and unquote(p.split("=")[0]).lower() != "password")
    text = scheme + (info.split(":")[0] + "@" if info is not None else "") + where + (q if kept else "") + kept \
        + hash_ + fragment
    for secret in sorted(passwords(url), key=len, reverse=True):
        text = text.replace(secret, HIDDEN)     # what a password= holding '&' left behind
    return text


def passwords(url: str) -> set[str]:
    """Every form the password(s) in a connection string can take in a message: as written, and
    percent-decoded or quoted. A URL that does not parse (a bad IPv6 host, a stray bracket) still
    gives up the text between its user's ':' and the last '@'."""
    found = set()
    for m in PASSWORD_KV.finditer(url):
        v = m.group(2)
        found |= {v, v[1:-1], v[1:-1].replace("\\'", "'").replace("\\\\", "\\")} if v.startswith("'") else {v}
    if "://" in url:
        _, info, _ = userinfo(url)
        if info and ":" in info:
            found |= pieces(info.split(":", 1)[1])
        query = url.partition("?")[2]
        for q in query.split("&"):
            k, _, v = q.partition("=")
            if unquote(k).lower() == "password":
                found.add(v)
        lowered = query.lower()
        if "password=" in lowered:     # a password holding '&' unescaped: all that follows may be it
            found.add(query[lowered.index("password=") + len("password="):])
    out = set()
    for v in found:
        if v:
            out |= {v, unquote(v), quote(v, safe=""), unquote(v, errors="replace")}
    return {v for v in out if v}


def pieces(password: str) -> set[str]:
    """A URL's password, and each part of it a parser reading it by another rule than libpq's
    shows as something else (after an '@' it is the host: "failed to resolve host 'REST@HOST'";
    after '/', '?' or '#' the path, query or fragment): the whole, and every part of it between
    those characters of 4 characters or more (fewer would scrub common letters from every
    message, and give away little)."""
    cuts = [m.end() for m in re.finditer(r"[@/?#]", password)]
    parts = set(re.split(r"[@/?#]", password)) | {password[i:] for i in cuts}
    return {password} | {p for p in parts if len(p) >= 4}


def known(url: str | None) -> str | None:
    """Remember a store URL's passwords, so that scrub() takes them out of any message that
    quotes them (the database library's errors quote a URL they cannot parse, whole); the URL."""
    if url:
        _SECRETS.update(passwords(url))
    return url


def scrub(text: str) -> str:
    """text with every known password (known()) and any URL's user:password@ taken out: the one
    pass every message zobench prints, records or logs goes through."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    text = URL_PASSWORD.sub(r"\1:" + HIDDEN + "@", text)
    return PASSWORD_KV.sub(lambda m: m.group(1) + "password=" + HIDDEN, text)


def said(e: BaseException) -> str:
    """An exception's message as one scrubbed line: its first line, or its type where it has none.
    Scrubbed whole before it is cut: a password may hold a line break."""
    text = scrub(str(e)).strip()
    return text.splitlines()[0] if text else type(e).__name__


def shown_argv(argv: list[str]) -> list[str]:
    """A command line as run.json keeps it: each connection string in it shown(), whether an
    argument of its own or after --store=."""
    def one(a: str) -> str:
        opt, eq, value = a.partition("=") if a.startswith("--") else ("", "", a)
        if value.startswith(("postgres://", "postgresql://")) or PASSWORD_KV.search(value):
            return opt + eq + shown(value)
        return a
    return [one(a) for a in argv]
