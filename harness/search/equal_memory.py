"""Katti et al.'s Fig. 4 as a run: under one memory budget, each method trains the largest model
of a family that fits it, for the same wall-clock time (hyper.max_train_seconds), so that what is
compared is what a board with that much memory can reach, not one model's speed.

The model of each method is the suite's (equal_memory.models), else zobench fit's answer on the
suite's target, searched when the run starts with the run's own batch, context, optimizer and
data: a fit run per method, kept in the store like any other, which the study's plan names. Each
study job then runs under the budget itself (Job.mem_limit), so a model that fitted in the
probes' three steps but not in a whole run ends oom, visibly, rather than passing unchecked.
"""
from __future__ import annotations

from workloads.spec import ZO_PART_FIELDS, Hyper

from harness.search import fit
from harness.errors import UserError
from harness.planning.inventory import Target
from harness.stores.store import Store
from harness.planning.suites import Suite


def models(store: Store, suite: Suite, target: Target, overrides: dict, methods: list,
           timeout_s: float | None = None, stop=None) -> tuple[dict[str, str], dict[str, str], list[str], list[str]]:
    """(method -> model, method -> the fit run that chose it, notes, found) for the selected
    methods: a method for which nothing of the family fits is left out, with the reason (a
    note); found says what each fit chose, for the caller to tell."""
    equal = suite.equal_memory
    budget = fit.parse_budget(equal.budget)
    hyper = Hyper(**{**suite.hyper, **overrides})
    dataset = suite.data_sets()[0][0]
    chosen, runs, notes, found = {}, {}, [], []
    for m in methods:
        if str(m) in equal.models:
            chosen[str(m)] = equal.models[str(m)]
            continue
        candidates = fit.configs("model", equal.family, None, hyper.batch_size, hyper.context)
        best, probes, run_id = fit.run(store, target, candidates, fit.Method(m, hyper.optimizer, hyper.checkpointing,
                                                                          {k: getattr(hyper, k) for k in ZO_PART_FIELDS}),
                                       budget, dataset=dataset, runtime=suite.runtimes[0],
                                       timeout_s=timeout_s or suite.timeout_s, seed=suite.seed, stop=stop)
        runs[str(m)] = run_id
        tried = ", ".join(f"{p.config.model.name} {p.status}" for p in probes)
        if best is None:
            notes.append(f"{m}: no {equal.family} model trains within {equal.budget} on {target.name} "
                         f"(fit run {run_id}: {tried})")
            continue
        chosen[str(m)] = best.model.name
        found.append(f"equal memory: {m} trains {best.model.name} ({best.model.params_total / 1e6:.2f}M parameters) "
                     f"within {equal.budget} on {target.name} (fit run {run_id}: {tried})")
    if not chosen:
        raise UserError(f"{suite.path}: equal_memory: no method trains any {equal.family} model within "
                        f"{equal.budget}: " + "; ".join(notes))
    return chosen, runs, notes, found
