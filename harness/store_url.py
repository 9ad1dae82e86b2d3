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
# @ before the next space or quote (a password may hold an @ of its own)
URL_PASSWORD = re.compile(r"(?i)(postgres(?:ql)?://[^:@/\s'\"]*):[^\s'\"]*@")
# the passwords of every store URL this process has been given (known()): what scrub() removes
_SECRETS: set[str] = set()


def shown(url: str) -> str:
    """The connection string without its password, in any form libpq takes it (user:password@,
    ?password= in a URL, password= in a key=value string), for a message, run.json or the
    store (a password belongs in ~/.pgpass or $PGPASSWORD, never on a line zobench prints or a
    file it writes). Never fails: what it cannot parse loses every password= it holds."""
    if "://" not in url:
        return " ".join(PASSWORD_KV.sub(r"\1", url).split())
    try:
        parts = urlsplit(url)
        user, at, hosts = parts.netloc.rpartition("@")
        query = "&".join(q for q in parts.query.split("&") if q and unquote(q.split("=")[0]).lower() != "password")
        return urlunsplit((parts.scheme, f"{user.split(':')[0]}@{hosts}" if at else hosts, parts.path, query,
                           parts.fragment))
    except ValueError:
        return re.sub(r"(?i)(://[^:@/]*):[^@]*@", r"\1@", re.sub(r"(?i)password=[^&\s]*&?", "", url))


def passwords(url: str) -> set[str]:
    """Every form the password(s) in a connection string can take in a message: as written, and
    percent-decoded or quoted. A URL that does not parse (a bad IPv6 host, a stray bracket) still
    gives up the text between its user's ':' and the last '@'."""
    found = set()
    for m in PASSWORD_KV.finditer(url):
        v = m.group(2)
        found |= {v, v[1:-1], v[1:-1].replace("\\'", "'").replace("\\\\", "\\")} if v.startswith("'") else {v}
    if "://" in url:
        netloc = url.split("://", 1)[1]
        cut = min([i for i in (netloc.find("/"), netloc.find("?")) if i >= 0] or [len(netloc)])
        head = ""
        if "@" in netloc[:cut]:
            head = netloc[:netloc.rfind("@", 0, cut)]
        elif "@" in netloc:     # a password holding '/' or '?': its user info runs to the last '@'
            head = netloc[:netloc.rfind("@")]
        if ":" in head:
            found.add(head.split(":", 1)[1])
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
