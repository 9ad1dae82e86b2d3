"""`zobench memory`: the analytic memory model's breakdown (harness/search/memory_model.py)."""
from __future__ import annotations

from workloads import jsonfile, vocab
from workloads.models import MODELS
from workloads.spec import Bounds, Hyper


from . import options


def add(sub) -> None:
    p = sub.add_parser("memory", help="analytic memory model: the paper's (Eqs. 2-5, 13-15) from layer shapes, "
                                      "a transformer's from its ops, with its step's predicted peak beside the "
                                      "total that bounds it (docs/transformers.md)")
    p.add_argument("--model", default="lenet5", choices=tuple(MODELS), help="the network (workloads/models.py)")
    p.add_argument("--points", type=options.number(int, Bounds(1)),
                   help="a point-cloud model: the number of points per cloud (default: the model's own)")
    p.add_argument("--context", type=options.number(int, Bounds(1, Hyper.BOUNDS["context"].hi)),
                   help="a transformer: tokens per sequence (default: the model's own)")
    p.add_argument("--batch", type=options.number(int, Hyper.BOUNDS["batch_size"]), required=True, help="batch size")
    p.add_argument("--precision", choices=vocab.PRECISIONS, default="fp32")
    p.add_argument("--method", choices=vocab.METHODS, help="one method (default: all four)")
    p.add_argument("--bp-layers", type=options.number(int, Bounds(1)),
                   help="elastic-zo: how many final FC layers (a transformer: units, the head then blocks) "
                        "BP trains (default 1)")
    p.add_argument("--optimizer", choices=Hyper.CHOICES["optimizer"], default="sgd", help="BP optimizer (adam: Eq. 5)")
    p.add_argument("--checkpointing", action="store_true",
                   help="a transformer: per-block activation checkpointing of the BP part")
    options.add_zo_parts(p)
    p.add_argument("--json", action="store_true", help="print a JSON list of breakdowns")
    p.set_defaults(main=main)


def main(args) -> int:
    from harness.search import memory_model

    parts = options.zo_parts("memory", args.zo_parts)
    rows = memory_model.asked(args.model, args.batch, args.precision, args.method, args.bp_layers, args.optimizer,
                              args.points, args.context or 0, args.checkpointing, Hyper(**parts) if parts else None)
    print(jsonfile.dumps([r.to_dict() for r in rows]) if args.json else memory_model.table(rows))
    return 0
