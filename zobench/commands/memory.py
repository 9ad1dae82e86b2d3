"""`zobench memory`: the analytic memory model's breakdown (harness/search/memory_model.py)."""
from __future__ import annotations

from workloads import jsonfile, vocab
from workloads.models import MODELS
from workloads.spec import Bounds, Hyper

from harness.errors import UserError
from harness.planning.suites import MethodChoice


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
    p.add_argument("--precision", choices=vocab.PRECISIONS, default="fp32", help="fp32 (default) or int8")
    p.add_argument("--method", help="one method, as run, tune and fit take it: full-bp, full-zo, elastic-zo:K (or "
                                    "elastic-zo with --bp-layers K); default: all four")
    p.add_argument("--bp-layers", type=options.number(int, Bounds(1)),
                   help="elastic-zo: how many final FC layers (a transformer: units, the head then blocks) "
                        "BP trains (default 1)")
    p.add_argument("--optimizer", choices=Hyper.CHOICES["optimizer"], default="sgd", help="BP optimizer (adam: Eq. 5)")
    p.add_argument("--checkpointing", action="store_true",
                   help="a transformer: per-block activation checkpointing of the BP part")
    p.add_argument("--loss-chunk", type=options.number(int, Hyper.BOUNDS["loss_chunk"]), default=0,
                   help="a language model: tokens its LM head and loss take at a time (hyper.loss_chunk; "
                        "default 0: Liger's rule; -1: the logits whole, as before the loss in chunks)")
    options.add_zo_parts(p)
    p.add_argument("--json", action="store_true", help="print a JSON list of breakdowns")
    p.set_defaults(main=main)


def method_of(args) -> tuple[str | None, int | None]:
    """--method and --bp-layers as the memory model takes them: elastic-zo:K parsed as every
    command parses a method (MethodChoice), elastic-zo alone left to --bp-layers (default 1)."""
    if args.method is None or args.method in vocab.METHODS:
        return args.method, args.bp_layers
    try:
        choice = MethodChoice.parse(args.method)
    except ValueError as e:
        raise UserError(f"memory --method {args.method!r}: {e}") from None
    if args.bp_layers is not None and args.bp_layers != choice.bp_layers:
        raise UserError(f"memory --bp-layers {args.bp_layers}: --method {args.method} says {choice.bp_layers}")
    return choice.method, choice.bp_layers or None


def main(args) -> int:
    from harness.search import memory_model

    parts = options.zo_parts("memory", args.zo_parts)
    method, bp_layers = method_of(args)
    rows = memory_model.asked(args.model, args.batch, args.precision, method, bp_layers, args.optimizer,
                              args.points, args.context or 0, args.checkpointing, Hyper(**parts) if parts else None,
                              args.loss_chunk)
    print(jsonfile.dumps([r.to_dict() for r in rows]) if args.json else memory_model.table(rows))
    return 0
