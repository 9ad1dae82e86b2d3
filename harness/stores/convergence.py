"""Whether a job's training converged: its result's epochs judged as `diverged`, `unstable` or
healthy (docs/results.md, "Convergence").

A job whose loss exploded still took all its steps, so its status stays `ok` and its time and
memory are real measurements; but its final test accuracy is not what the method reaches, and
a table that shows it bare presents a diverged Full ZO run as Full ZO's accuracy. The runner
records the epochs; the harness judges them once, when the job ends (harness/execution/job.py), and every
reader goes through of(), which judges an older result that has no record, so that results
stored before this existed are flagged too. No I/O: the judgement is a function of the result.
"""
from __future__ import annotations

import math
import re

# The flags, worst first: a job is at most one of them (unstable excludes diverged).
FLAGS = ("diverged", "unstable")

# diverged: the last epoch's train loss ended above the first epoch's by more than DIVERGE_RATIO
# times it AND more than DIVERGE_MARGIN. An epoch's train loss is a mean over its batches, so a run
# flat at chance (ln 10 = 2.30 nats for 10 classes) wanders by a few hundredths from epoch to
# epoch; 10% (0.23 nats at chance) is well above that and far below a real explosion (Full ZO at
# a too-high learning rate: 2.20 -> 238). The absolute margin keeps a small loss (a fine-tuned model
# going 0.02 -> 0.03) from counting as 50% worse. A loss that was not finite is diverged too.
DIVERGE_RATIO = 1.10
DIVERGE_MARGIN = 0.10           # nats
# unstable (not diverged): the last epoch's train loss ended more than UNSTABLE_RATIO times AND
# more than UNSTABLE_MARGIN above the lowest of any epoch (it got better, then blew up and came
# partly back), or the last epoch's test accuracy ended more than UNSTABLE_ACCURACY_DROP below the
# best epoch's. 1.5x is far past an epoch mean's noise; 0.25 nats keeps a near-zero loss (0.01 ->
# 0.02) from counting. Healthy short runs' test accuracy swings from epoch to epoch: a 200-sample
# test set's sampling noise alone is sqrt(0.25 / 200) = 3.5 points, and healthy 3-epoch runs here
# went 70.4 -> 63.4 (Full BP) and 23.5 -> 15.0 (Full ZO near chance); 15 points clears those, and a
# collapse (ElasticZO 62.5 -> 31.1 at the end of a blow-up) is twice that.
UNSTABLE_RATIO = 1.5
UNSTABLE_MARGIN = 0.25          # nats
UNSTABLE_ACCURACY_DROP = 0.15   # accuracy as a fraction: 15 percentage points
# The runner's names for an epoch's losses that were not finite (workloads/jsonfile.py): e.g.
# "epochs[2].train_loss: nan". start_eval's is the starting weights', not training's.
NONFINITE_LOSS = re.compile(r"epochs\[\d+\]\.(train|test)_loss\b")
LOSSES = ("train_loss", "test_loss")


def judge(result: dict) -> dict | None:
    """The convergence record of a result from its epochs: its flags (empty when healthy) and
    the numbers they were judged on; None when the result has no epochs (it never trained)."""
    epochs = [e for e in result.get("epochs") or [] if isinstance(e, dict)]
    if not epochs:
        return None
    train = [_number(e.get("train_loss")) for e in epochs]
    finite = [x for x in train if x is not None]
    accs = [(_number(e.get("test_accuracy")), e.get("epoch", i + 1)) for i, e in enumerate(epochs)]
    best = max(((a, n) for a, n in accs if a is not None), key=lambda p: p[0], default=(None, None))
    first, final = train[0], train[-1]
    final_acc = accs[-1][0]
    nonfinite = any(k in e and (e[k] is None or isinstance(e[k], float) and not math.isfinite(e[k]))
                    for e in epochs for k in LOSSES) \
        or any(isinstance(x, str) and NONFINITE_LOSS.match(x) for x in result.get("nonfinite") or [])
    if nonfinite or (len(epochs) > 1 and first is not None and final is not None
                     and final > DIVERGE_RATIO * first and final - first > DIVERGE_MARGIN):
        flags = ["diverged"]
    elif len(epochs) > 1 and (
            (final is not None and final > UNSTABLE_RATIO * min(finite) and final - min(finite) > UNSTABLE_MARGIN)
            or (final_acc is not None and best[0] - final_acc > UNSTABLE_ACCURACY_DROP)):
        flags = ["unstable"]
    else:
        flags = []
    return {"flags": flags, "first_train_loss": first, "min_train_loss": min(finite, default=None),
            "final_train_loss": final, "best_test_accuracy": best[0], "best_epoch": best[1],
            "final_test_accuracy": final_acc}


def of(result: dict) -> dict | None:
    """A result's convergence: the record the harness stored when the job ended, or for a result
    stored before there was one, judged now; None for a job that did not end ok or never trained."""
    if not isinstance(result, dict) or result.get("status") != "ok":
        return None
    return result["convergence"] if isinstance(result.get("convergence"), dict) else judge(result)


def flag(result: dict) -> str | None:
    """The result's flag ("diverged" or "unstable"), None when healthy or unknown."""
    return worst((of(result) or {}).get("flags") or [])


def worst(flags) -> str | None:
    """The worst of some flags (a group of repeats is as bad as its worst), None for none."""
    return next((f for f in FLAGS if f in set(flags)), None)


def annotate(accuracy: str, flag, best: str) -> str:
    """An accuracy as a table shows it, with the flag and the best epoch's beside it when the run
    did not converge ("0.196 diverged (best 0.480)"): one format for the results table and the
    report. A flag that is not a non-empty string (None, "", a table's NaN) is none."""
    return f"{accuracy} {flag} (best {best})" if isinstance(flag, str) and flag else accuracy


def _number(x) -> float | None:
    """x as a finite number, None where it is null, missing or not finite."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)
