"""A store's connection string as zobench shows it: every form of a password libpq takes removed,
so no message, run.json or pushed row holds one. Its own module because every command that
records its command line needs it, and the shared store's driver is not needed for that."""
from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

# a password in a key=value connection string: password=x, password = 'x y', password='it\\'s'
PASSWORD_KV = re.compile(r"""(?i)(^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S*)""")


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


def shown_argv(argv: list[str]) -> list[str]:
    """A command line as run.json keeps it: each connection string in it shown(), whether an
    argument of its own or after --store=."""
    def one(a: str) -> str:
        opt, eq, value = a.partition("=") if a.startswith("--") else ("", "", a)
        if value.startswith(("postgres://", "postgresql://")) or PASSWORD_KV.search(value):
            return opt + eq + shown(value)
        return a
    return [one(a) for a in argv]
