"""zobench: the command line. Exit 0 = all good, 1 = a job did not end ok,
2 = bad usage or configuration (one line on stderr, no traceback).

It only parses: each command's options and its call into the library are in zobench/commands/,
and here is what every command shares, the one-line answer to a user's error."""
from __future__ import annotations

import os
import sys

from harness.errors import UserError

from .commands import COMMANDS
from .commands.options import Parser


def build_parser() -> Parser:
    ap = Parser(prog="zobench", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add(sub)
    return ap


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.main(args)
    except UserError as e:
        print(f"zobench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # `zobench run` handles its own (zobench/running.py); elsewhere nothing is left running
        print("zobench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # `zobench results | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        return 0
    except Exception as e:      # the shared store's driver: a table dropped or changed by hand under a query
        if type(e).__module__.split(".")[0] != "psycopg":
            raise
        said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"zobench: error: the shared store: {type(e).__name__}: {said}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
