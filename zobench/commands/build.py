"""`zobench build`: zobench-train built for a target's CPU."""
from __future__ import annotations

import sys

from harness.planning import inventory
from harness.preparation.artifacts import sha256
from harness.preparation.build import BuildStopped, build, cpu_choice
from harness.boards.probe import probe
from harness.execution.board import transport_for
from harness.boards.transport import TransportError

from . import options


def add(sub) -> None:
    p = sub.add_parser("build", help="build zobench-train for a target's CPU: its pin, else this machine's "
                                     "(local) or the one probing the board finds")
    options.add_results(p)
    p.add_argument("--target", required=True, help="the target to build for (a name in the inventory, or local)")
    options.add_inventory(p)
    p.set_defaults(main=main)


def main(args) -> int:
    (target,) = inventory.resolve([args.target], args.inventory)
    choice = cpu_choice(target)
    if choice is None:      # a board whose CPU is not pinned: built for the one its probe finds, as a run does
        transport = transport_for(target)
        try:
            choice = cpu_choice(target, probe(transport, target))
        except TransportError as e:
            print(f"zobench: {target.name}: {e}; pin its CPU (cpu = NAME, docs/targets.md) to build without it",
                  file=sys.stderr)
            return 1
        finally:
            transport.close()
    from zobench.running import signals_stop

    with signals_stop() as (stop, caught):     # SIGTERM as SIGINT: the compilers are killed, and it is said
        try:
            binary = build(target, choice.cpu, stop)
        except BuildStopped as e:
            print(f"zobench: {e}", file=sys.stderr)
            return 128 + caught[0]
    print(f"{binary}  sha256 {sha256(binary)}  cpu {choice.cpu}: {choice.why}")
    return 0
