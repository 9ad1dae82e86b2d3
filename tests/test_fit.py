"""zobench fit: the search's rule on the real memory model, and real probes under a real memory
limit on this machine (workloads/launch.py's cgroup)."""
import json
from pathlib import Path

import pytest

from harness.planning.suites import Suite
from harness.search import fit
from harness.stores.store import Store
from workloads.models import ladder

from testkit.runners import cli, in_process

GPT2 = ladder("gpt2")


def run_fit(capsys, *args):
    r = cli(capsys, "fit", *args)
    return r.returncode, r.stdout, r.stderr


def fake_run(fits_below: int, footprint: int = 50 << 20):
    """A run(config, predicted) whose probes end ok while the model's memory plus footprint is
    under fits_below: the search's rule, without training anything."""
    method = fit.Method(fit.MethodChoice("full-bp"))
    made = []

    def run(c, predicted):
        status = "ok" if method.model_bytes(c) + footprint <= fits_below else "oom"
        made.append(c.model.name)
        return fit.Probe(c, predicted, c.label, status), footprint
    return run, made, method


@pytest.mark.parametrize("skew", [0.5, 1.0, 2.0])
def test_search_finds_the_largest_ok_whose_next_is_oom_whatever_the_prediction(skew):
    cands = fit.configs("model", "gpt2", None, 8, 128)
    budget = 600 << 20
    run, made, method = fake_run(budget)

    def predict(c, footprint):          # a model that is off by skew: the probes still decide
        return int(method.model_bytes(c) * skew) + footprint

    best, probes = fit.search(cands, budget, predict, run)
    i = cands.index(best)
    assert [p.status for p in probes if p.config == best] == ["ok"]
    assert [p.status for p in probes if p.config == cands[i + 1]] == ["oom"]
    assert probes[0].config == cands[0]             # the footprint is measured first
    assert len(made) == len(set(made))              # no configuration is probed twice


def test_search_says_none_when_the_smallest_does_not_fit():
    cands = fit.configs("model", "gpt2", None, 8, 128)
    run, made, method = fake_run(1 << 20)
    best, probes = fit.search(cands, 1 << 20, lambda c, f: method.model_bytes(c) + f, run)
    assert best is None and [p.status for p in probes] == ["oom"] and made == ["gpt2-1m"]


def test_configs_leave_out_models_that_cannot_take_the_context():
    assert [c.model.name for c in fit.configs("model", "gpt2", None, 8, 512)] == \
        [m.name for m in GPT2 if m.context >= 512]
    ctx = fit.configs("context", "gpt2", GPT2[0], 4, 0)
    assert [c.context for c in ctx] == [16, 32, 64, 128, 256] and {c.batch for c in ctx} == {4}


def test_fit_on_this_machine_under_a_budget(capsys, tmp_path):
    """The largest model it reports trains ok under the budget, the next size up ends oom, every
    probe is a result of the run; a budget too small for any size says so with exit 1."""
    rc, out, err = run_fit(capsys, "--results", str(tmp_path), "--budget", "700M", "--context", "128")
    store = Store(tmp_path)
    run_id = store.latest()
    results = {r["job"]["job_id"]: r for r in store.results(run_id)}
    launch = [json.loads(line) for r in results
              for line in (store.work_dir(run_id, r) / "stdout.log").read_text().splitlines()[:1]]
    if any(not e.get("method", "").startswith("cgroup") for e in launch):
        pytest.skip("no memory cgroup here: RLIMIT_AS limits address space, which torch reserves far beyond use")
    assert rc == 0, err
    best = out.split("largest: ")[1].split()[0]
    names = [c.label for c in fit.configs("model", "gpt2", None, 8, 128)]
    nxt = names[names.index(best) + 1]
    status = {job.split(".local.")[0].removeprefix("fit."): r["status"] for job, r in results.items()}
    assert status[best] == "ok" and status[nxt] == "oom"
    assert status[names[0]] == "ok"                                # the footprint probe
    assert all(s in ("ok", "oom") for s in status.values()) and len(status) == len(results) >= 3
    # the cgroup holds what it charged under 700M; RSS also counts the libraries' file pages, which
    # the cgroup charged to whoever read them first (seen 700.2 MiB beside two busy loops)
    assert results[next(j for j in results if best in j)]["memory"]["peak_rss_bytes"] < 1.1 * (700 << 20)

    rc, out, err = run_fit(capsys, "--results", str(tmp_path), "--budget", "100M", "--context", "128")
    assert rc == 1 and "too small" in err and "gpt2-1m" in err
    assert [r["status"] for r in store.results(store.latest())] == ["oom"]
    assert len(store.run_ids()) == 2 and len(store.results(run_id)) == len(results)   # the first run is kept


def test_fit_refuses_bad_input_in_one_line(capsys, tmp_path):
    for args, what in ((["--budget", "lots"], "expected a size"), (["--budget", "0M"], "expected a size above zero"),
                       (["--budget", "1G", "--vary", "batch", "--model", "lenet5"], "names one of the transformers"),
                       (["--budget", "1G", "--model-family", "opt"], "--model-family"),
                       (["--budget", "1G", "--method", "full-zo", "--checkpointing"], "checkpoint"),
                       (["--budget", "1G", "--dataset", "fashion-mnist"], "text data set"),
                       ([], "no --budget")):
        rc, out, err = run_fit(capsys, "--results", str(tmp_path), *args)
        assert rc == 2 and what in err and "Traceback" not in err, (args, err)
    assert not (tmp_path / "runs").exists() or Store(tmp_path).run_ids() == []


def test_the_zo_parts_count_in_the_prediction_and_train_in_the_probes():
    """--set zo_update=adam: Adam's two moments over the ZO part are in what fit predicts a
    candidate needs, and its probes train with the part."""
    c = fit.configs("model", "gpt2", None, 8, 64)[0]
    mezo, adam = fit.Method(fit.MethodChoice("full-zo")), fit.Method(fit.MethodChoice("full-zo"), zo={"zo_update": "adam"})
    n_zo = c.model.split("full-zo", 0)
    assert adam.model_bytes(c) - mezo.model_bytes(c) == 8 * n_zo
    probe = fit.suite_for(Suite("s", Path("s.toml"), methods=[adam.choice]), c, adam, "fortunes")
    assert probe.hyper["zo_update"] == "adam"
    bad = in_process("fit", "--budget", "1G", "--method", "full-zo", "--set", "epochs=2")
    assert bad.returncode == 2 and "fit --set epochs: only the ZO parts" in bad.stderr
