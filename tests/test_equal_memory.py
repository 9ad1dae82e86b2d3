"""The equal-memory study (Katti et al. Fig. 4, harness/search/equal_memory.py): a model per method,
every study job under the budget, each fine-tuning from its own model's language model, and the
report's chart and table; the classifier's start from a language model's weights."""
import json
from pathlib import Path

import numpy as np
import pytest

from harness.planning import inventory, plan, suites
from harness.stores.store import Store
from workloads.models import MODELS
from workloads.runner import initial_weights
from workloads.spec import JobSpec, SpecError
from workloads.launch import parse_size

from harness.stores import records
from reports import equal_memory as report_rows
from testkit.runners import cli, python, script, REPO

FIG4 = REPO / "scripts" / "katti_fig4.py"


def report_rows_of(store: Store, run_id: str):
    """A study run's rows as the report reads them, and its studies."""
    from reports import report

    plans = [store.run_plan(run_id)]
    return report._load(store, [run_id], plans), report_rows.studies([run_id], plans)

SUITE = """
description = "equal memory, tiny"
runtimes = ["torch"]
methods = ["full-bp", "full-zo"]
timeout_s = 300
{top}

[workload]
dataset = "fortunes-topics"
{workload}

[equal_memory]
budget = "{budget}"
{models}

[hyper]
epochs = 1000
max_train_seconds = 0.5       # ends training as the real suite's 90 s do: a few steps, an epoch recorded
batch_size = 4
context = 32
train_samples = 32
test_samples = 32
optimizer = "adam"
lr_bp = 1e-3
lr_zo = 1e-4

[pretrain]
dataset = "fortunes"

[pretrain.fp32]
epochs = 1
train_samples = 64
"""
BOTH = 'models = { "full-bp" = "gpt2-1m", "full-zo" = "gpt2-1m" }'


def suite_file(tmp_path: Path, budget="500M", models=BOTH, workload="", top='targets = ["local"]') -> Path:
    p = tmp_path / "equal.toml"
    p.write_text(SUITE.format(budget=budget, models=models, workload=workload, top=top))
    return p


@pytest.mark.parametrize("change, what", [
    (dict(budget="lots"), "equal_memory.budget: expected a size above zero like"),
    (dict(budget="0M"), "equal_memory.budget: expected a size above zero like"),
    (dict(models='models = { "elastic-zo:1" = "gpt2-1m" }'), "equal_memory.models.elastic-zo:1: not a method"),
    (dict(models='models = { "full-bp" = "lenet5" }'), "equal_memory.models.full-bp: expected a gpt2 model"),
    (dict(workload='model = "gpt2-1m"'), "workload.model: an equal_memory suite gives each method its model"),
    (dict(top='targets = ["local", "pi"]'), "targets: an equal_memory suite fits its models to one target"),
    (dict(), None),
])
def test_a_malformed_equal_memory_table_is_named(tmp_path, change, what):
    path = suite_file(tmp_path, **change)
    if what is None:        # the control: the same file, well formed, loads
        assert suites.load(str(path)).equal_memory.models == {"full-bp": "gpt2-1m", "full-zo": "gpt2-1m"}
        return
    with pytest.raises(Exception) as e:
        suites.load(str(path))
    assert str(path) in str(e.value) and what in str(e.value)


def test_the_plan_gives_each_method_its_model_its_pretraining_and_the_budget():
    s = suites.load(str(Path(__file__).parent.parent / "workloads/suites/quick-equal-memory.toml"))
    models = {"full-bp": "gpt2-4m", "full-zo": "gpt2-12m", "elastic-zo:1": "gpt2-12m"}
    jobs, _ = plan.make(s, inventory.resolve(["local"], None), models=models)
    pre = {j.job_id: j for j in jobs if j.spec["save_weights"]}
    study = [j for j in jobs if not j.spec["save_weights"]]
    # one language model per model the study fine-tunes, learnt on fortunes with no budget
    assert sorted(j.spec["workload"]["model"] for j in pre.values()) == ["gpt2-12m", "gpt2-4m"]
    assert {j.spec["workload"]["dataset"] for j in pre.values()} == {"fortunes"}
    assert {j.mem_limit for j in pre.values()} == {""}
    assert all(j.spec["workload"]["architecture"]["classes"] == 0 for j in pre.values())
    for j in study:
        key = j.spec["method"] + (f":{j.spec['bp_layers']}" if j.spec["method"] == "elastic-zo" else "")
        assert j.spec["workload"]["model"] == models[key] and j.mem_limit == "500M"
        assert j.spec["workload"]["dataset"] == "fortunes-topics" and j.spec["workload"]["architecture"]["classes"] == 43
        assert pre[j.spec["pretrained_from"]].spec["workload"]["model"] == models[key]
        assert j.spec["hyper"]["max_train_seconds"] == 90
    with pytest.raises(Exception, match="no model for elastic-zo:1"):
        plan.make(s, inventory.resolve(["local"], None), models={"full-bp": "gpt2-4m", "full-zo": "gpt2-12m"})


def test_katti_fig4_cpu_pretrains_every_model_on_the_same_sequences_and_trains_each_method_equally_long():
    """The long study (docs/transformers.md): its models are the suite's own (no fit at run time),
    each language model learns from the same 6,000 sequences (a larger model's start is better by
    its size alone), and every method fine-tunes under 700M for the same 720 s."""
    s = suites.load(str(Path(__file__).parent.parent / "workloads/suites/katti-fig4-cpu.toml"))
    assert s.equal_memory.models == {"full-bp": "gpt2-12m", "full-zo": "gpt2-29m", "elastic-zo:1": "gpt2-29m"}
    jobs, _ = plan.make(s, inventory.resolve(["local"], None), models=s.equal_memory.models)
    pre = [j for j in jobs if j.spec["save_weights"]]
    study = [j for j in jobs if not j.spec["save_weights"]]
    assert sorted(j.spec["workload"]["model"] for j in pre) == ["gpt2-12m", "gpt2-29m"]
    assert {(j.spec["hyper"]["train_samples"], j.spec["hyper"]["epochs"], j.spec["hyper"]["batch_size"],
             j.spec["hyper"]["context"]) for j in pre} == {(6000, 1, 8, 64)}
    assert {(j.mem_limit, j.spec["hyper"]["max_train_seconds"], j.spec["hyper"]["train_samples"]) for j in study} == \
        {("700M", 720, 1024)} and len(study) == 3
    # its control: ElasticZO k=1 on Full BP's model, everything else the study's
    control = suites.load(str(Path(__file__).parent.parent / "workloads/suites/katti-fig4-cpu-control.toml"))
    assert control.equal_memory.models == {"elastic-zo:1": "gpt2-12m"} and control.methods != s.methods
    assert (control.hyper, control.pretrain, control.equal_memory.budget, control.data_sets()) == \
        (s.hyper, s.pretrain, s.equal_memory.budget, s.data_sets())


def test_a_classifier_starts_from_a_language_models_weights_with_a_head_drawn_from_the_seed(tmp_path):
    lm = MODELS["gpt2-1m"]
    clf = lm.with_classes(43)
    body = lm.init_weights(7) + 1.0          # any weights, other than the classifier's own init
    body.astype("<f4").tofile(tmp_path / "lm.bin")
    spec = JobSpec.from_dict({"job_id": "j", "method": "full-bp", "init_weights": str(tmp_path / "lm.bin"),
                              "workload": {"model": "gpt2-1m", "dataset": "fortunes-topics",
                                           "architecture": clf.to_dict()}, "seed": 3})
    w = initial_weights(spec, clf)
    assert w.size == clf.params_total == body.size + 43 * lm.width + 43
    np.testing.assert_array_equal(w[:body.size], body)
    np.testing.assert_array_equal(w[body.size:], clf.init_weights(3)[body.size:])
    body[:-1].astype("<f4").tofile(tmp_path / "short.bin")
    with pytest.raises(SpecError, match=rf"expected {clf.params_total} for gpt2-1m \(or {body.size}, its language model"):
        initial_weights(JobSpec.from_dict({**spec.to_dict(), "init_weights": str(tmp_path / "short.bin")}), clf)


def launches(store: Store, run_id: str) -> dict:
    """Each job's launcher line: the memory limit it ran under, and how it was applied."""
    return {r["job"]["job_id"]: json.loads((store.work_dir(run_id, r["job"]["job_id"]) / "stdout.log").read_text().splitlines()[0])
            for r in store.results(run_id)}


def test_a_study_runs_each_method_under_the_budget_from_its_pretrained_model(capsys, tmp_path):
    path = suite_file(tmp_path)
    r = cli(capsys, "run", "--suite", path, "--results", tmp_path / "res")
    assert r.returncode == 0, r.stderr
    store = Store(tmp_path / "res")
    run_id = store.latest()
    meta = store.run_plan(run_id)["equal_memory"]
    assert meta == {"budget": "500M", "family": "gpt2", "models": {"full-bp": "gpt2-1m", "full-zo": "gpt2-1m"},
                    "fit_runs": {}}
    results = {r["job"]["job_id"]: r for r in store.results(run_id)}
    (pre,) = [r for r in results.values() if r["job"]["save_weights"]]
    study = [r for r in results.values() if not r["job"]["save_weights"]]
    assert len(study) == 2
    for r in study:     # the body it started from is exactly the language model's final weights
        assert r["model"]["init_sha256"] == pre["model"]["weights_sha256"]
        assert r["epochs"] and r["start_eval"]["test_accuracy"] is not None
    limits = launches(store, run_id)
    assert limits[pre["job"]["job_id"]].get("mem_limit") is None
    assert {limits[r["job"]["job_id"]]["mem_limit"] for r in study} == {parse_size("500M")}
    report = store.runs / run_id / "report"
    md = (report / "report.md").read_text()
    assert "## Equal memory" in md and (report / "equal_memory.png").is_file()
    assert "## Fine-tuning" not in md       # no Table 2 across different models' starting points
    section = md.split("## Equal memory")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| Full ")]
    assert len(rows) == 2 and all("| gpt2-1m |" in line and "| 500M |" in line for line in rows)
    # its compact records (harness/stores/records.py) hold what the study's table shows, memory and
    # load too: scripts/katti_fig4.py draws the same table from them as the report from the run
    live = report_rows.table(*report_rows_of(store, run_id))
    assert live["peak RSS (MiB)"].ne("-").all() and live["load"].ne("unknown").all()
    df, found = script("katti_fig4.py").frame(records.of_runs(store, [run_id]))
    assert report_rows.table(df, found).equals(live)


def test_a_method_nothing_fits_is_left_out_with_its_fit_run(capsys, tmp_path):
    path = suite_file(tmp_path, budget="64M", models='models = { "full-bp" = "gpt2-1m" }')
    r = cli(capsys, "run", "--suite", path, "--results", tmp_path / "res", "--no-report")
    store = Store(tmp_path / "res")
    fit_run = next(i for i in store.run_ids() if "fit" in store.run_plan(i))
    (probe,) = store.results(fit_run)
    if json.loads((store.work_dir(fit_run, probe["job"]["job_id"]) / "stdout.log").read_text().splitlines()[0]).get(
            "method", "").startswith("cgroup") is False:
        pytest.skip("no memory cgroup here: RLIMIT_AS limits address space, which torch reserves far beyond use")
    assert probe["status"] == "oom" and probe["job"]["workload"]["model"] == "gpt2-1m"
    assert f"left out full-zo: no gpt2 model trains within 64M on local (fit run {fit_run}: gpt2-1m oom)" in r.stderr
    study = next(i for i in store.run_ids() if "equal_memory" in store.run_plan(i))   # ids of one second sort at random
    assert store.run_plan(study)["equal_memory"]["models"] == {"full-bp": "gpt2-1m"}
    assert {r["job"]["method"] for r in store.results(study) if not r["job"]["save_weights"]} == {"full-bp"}
    # the given model does not fit 64M either: it ends oom under the budget, recorded, exit 1
    assert r.returncode == 1
    assert [r["status"] for r in store.results(study) if not r["job"]["save_weights"]] == ["oom"]


def test_the_docs_katti_fig4_block_is_drawn_from_its_committed_records():
    """docs/transformers.md's Katti Fig. 4 block (pretraining, the study's table, the trend) is
    what scripts/katti_fig4.py draws from the records committed beside it, number for number."""
    fig4 = script("katti_fig4.py")
    block = fig4.DOC.read_text().partition(fig4.BEGIN)[2].partition(fig4.END)[0]
    assert block == "\n" + fig4.block(records.read(fig4.RECORDS))
    assert "| Full BP | gpt2-12m |" in block and "| Full ZO | gpt2-29m |" in block
    assert (fig4.DOC.parent / "transformers" / f"{fig4.CHART}.png").is_file()


@pytest.mark.parametrize("args, said", [
    (["records"], "records takes the runs' ids"),
    (["records", "20250101-120000-ab12"], "unknown run '20250101-120000-ab12'"),
    (["doc", "20250101-120000-ab12"], "doc takes no run"),
    (["draw"], "invalid choice: 'draw'"),
])
def test_katti_fig4_scripts_bad_input_is_one_line_and_exit_2_with_nothing_written(tmp_path, args, said):
    before = FIG4.parent.parent.joinpath("docs", "transformers.md").read_text()
    p = python(FIG4, *args, "--results", str(tmp_path / "r"), cwd=Path.cwd(), timeout=60)
    assert p.returncode == 2 and said in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("katti_fig4.py: error:")
    assert FIG4.parent.parent.joinpath("docs", "transformers.md").read_text() == before
