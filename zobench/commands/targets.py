"""`zobench targets`: the targets zobench knows, and a board's probe."""
from __future__ import annotations

import contextlib
import sys

from workloads import jsonfile

from harness.planning import inventory
from harness.errors import UserError
from harness.boards.probe import probe
from harness.execution.board import reach, transport_for
from harness.boards.transport import Stop, TransportError

from . import options


def add(sub) -> None:
    p = sub.add_parser("targets", help="the targets zobench knows")
    options.add_results(p)
    options.add_inventory(p)
    p.add_argument("--json", action="store_true", help="probe: print the facts as JSON")
    p.add_argument("action", choices=("list", "probe"))
    p.add_argument("name", nargs="?", help="probe: the target to probe")
    p.set_defaults(main=main)


def main(args) -> int:
    if args.action == "probe":
        if not args.name:
            raise UserError("targets probe: name the target to probe")
        (target,) = inventory.resolve([args.name], args.inventory)
        try:
            # Ctrl-C raises here (main says so): the place is released on the way out
            with reach(target, Stop(), options.say) as there, \
                    contextlib.closing(transport_for(there)) as transport:
                facts = probe(transport, there)
        except TransportError as e:
            print(f"zobench: {target.name}: {e}", file=sys.stderr)
            return 1
        if args.json:
            print(jsonfile.dumps(facts))
        else:
            for key, value in facts.items():
                shown = ", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else \
                    " ".join(value) if isinstance(value, list) else value
                print(f"{key:20} {shown}")
        return 0
    for t in inventory.load(args.inventory).values():
        where = "this machine" if t.transport == "local" else \
            f"{t.user + '@' if t.user else ''}{t.host}{':' + str(t.port) if t.port else ''}"
        where = f"labgrid {t.labgrid['coordinator']} {t.labgrid['place'] or t.labgrid['tags']}" if t.labgrid else where
        print(f"{t.name:20} {where:28} {t.arch:8} {','.join(t.runtimes):16} {t.device:5} {t.source}")
    return 0
