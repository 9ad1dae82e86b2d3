"""`zobench fit`: the largest model, batch or context a method trains within a memory budget
(harness/search/fit.py)."""
from __future__ import annotations

import sys

from workloads import vocab
from workloads.spec import Bounds, Hyper

from harness.search import fit
from harness.planning import inventory, suites
from harness.stores import pgstore
from harness.stores.store import Store

from .. import running
from . import options


def add(sub) -> None:
    p = sub.add_parser("fit", help="the largest model (or batch, or context) a method trains on a target "
                                   "within a memory budget: predicted, then confirmed by short runs")
    options.add_results(p)
    options.add_store(p, "push the fit run (its probes) to this shared store when it ends")
    p.add_argument("--target", default="local", help="where the probes run (default: this machine)")
    options.add_inventory(p)
    p.add_argument("--budget", help="memory budget, like 512M or 2G (default: the target's mem_limit)")
    p.add_argument("--model-family", default="gpt2", help="the ladder to climb (workloads/models.py)")
    p.add_argument("--model", help="--vary batch|context: the model whose batch or context grows")
    p.add_argument("--method", default="full-bp", help="full-bp, full-zo or elastic-zo:K")
    p.add_argument("--optimizer", choices=Hyper.CHOICES["optimizer"], default="sgd", help="BP optimizer (default sgd)")
    p.add_argument("--checkpointing", action="store_true", help="full-bp, elastic-zo: per-block checkpointing")
    options.add_zo_parts(p)
    p.add_argument("--context", type=options.number(int, Bounds(1, 1 << 20)),
                   help="tokens a sequence (default: each model's own context)")
    p.add_argument("--batch", type=options.number(int, Bounds(1, 1 << 20)), default=8, help="batch size (default 8)")
    p.add_argument("--vary", choices=fit.VARY, default="model", help="what grows (default: the model)")
    p.add_argument("--dataset", default="fortunes", help="the text the probes train on (default fortunes)")
    p.add_argument("--runtime", choices=("torch",), default="torch", help="where the probes train (torch only)")
    p.add_argument("--precision", choices=[p for p in vocab.PRECISIONS if p != "int8"], default="fp32",
                   help="the transformer's type: fp32, bf16 or fp16 (default fp32)")
    p.add_argument("--timeout", type=options.number(float, suites.TIMEOUT_S), default=900.0, metavar="S",
                   help="seconds a probe may take (default 900)")
    p.set_defaults(main=main)


def main(args) -> int:
    (target,) = inventory.resolve([args.target], args.inventory)
    method, candidates, budget = fit.asked(target, args.budget, args.vary, args.model, args.model_family,
                                           args.method, args.optimizer, args.checkpointing, args.batch,
                                           args.context or 0, options.zo_parts("fit", args.zo_parts), args.precision)
    store = Store(args.results)
    with running.signals_stop() as (stop, caught):
        try:
            best, probes, run_id = fit.run(store, target, candidates, method, budget, vary=args.vary,
                                           dataset=args.dataset, runtime=args.runtime, timeout_s=args.timeout,
                                           stop=stop)
        except fit.Stopped as e:
            print(e, file=sys.stderr)
            return 128 + caught[0]
    pushed = not (url := pgstore.url_from(args.store)) or running.push(url, store, [run_id], None, options.say)
    human = fit.memory_model.human
    print(f"{'probe':40} {'params':>10} {'predicted':>11} {'peak':>11}  status")
    for p in probes:
        peak = human(p.peak_rss_bytes) if p.peak_rss_bytes else "-"
        print(f"{p.config.label:40} {p.config.model.params_total / 1e6:9.2f}M {human(p.predicted_bytes):>11} "
              f"{peak:>11}  {p.status}{': ' + p.error if p.error and p.status != 'ok' else ''}")
    what = f"{method.choice} on {target.name} within {human(budget)}"
    if best is None:
        print(f"fit: nothing trains: {what} is too small for {candidates[0].label}, the smallest "
              f"(run {run_id})", file=sys.stderr)
        return 1 if pushed else 2
    print(f"largest: {best.label} ({best.model.params_total / 1e6:.2f}M parameters) trains {what} (run {run_id})")
    return 0 if pushed else 2
