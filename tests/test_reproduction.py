"""The suites named for the ElasticZO paper: their reports set each cell beside the paper's, and
(slow) one epoch of each tuned configuration gives the first-epoch loss its reproduction run
recorded (tests/fixtures/reproduction.json), so a change that moves the reproduced numbers is
seen without the hours of `make reproduce`."""
import json
from pathlib import Path

import pytest

from harness.stores.store import Store
from reports import paper

from testkit.compare_runs import made_up_result, made_up_run
from testkit.runners import cli, script, start

FIXTURE = Path(__file__).parent / "fixtures" / "reproduction.json"
TORCH = "torch against the C++ binary (FP32)"


def test_a_paper_suite_report_sets_each_cell_beside_the_papers(tmp_path, capsys, native):
    results = tmp_path / "results"
    r = cli(capsys, "run", "--suite", "paper-fmnist", "--runtime", "cpp", "--precision", "fp32", "--method", "full-zo",
            "--method", "elastic-zo:2", "--target", "local-1t", "--set", "epochs=1", "--set", "train_samples=320",
            "--set", "test_samples=200", "--results", results)
    assert r.returncode == 0, r.stderr
    store = Store(results)
    run_id = store.latest()
    accuracy = {x["job"]["method"] + str(x["job"]["bp_layers"]): 100 * x["epochs"][-1]["test_accuracy"]
                for x in store.results(run_id)}
    md = (results / "runs" / run_id / "report" / "report.md").read_text()
    assert "## Against the paper: Table 1" in md and "Table 2" not in md.split("## Against the paper: Table 1")[1]
    for method, key, cell in (("Full ZO", "full-zo0", 77.09), ("ElasticZO k=2 (ZO-Feat-Cls1)", "elastic-zo2", 86.60)):
        row = next(line for line in md.splitlines() if line.startswith(f"| {method} | fashion-mnist | FP32 | cpp |"))
        assert f"| {accuracy[key]:.2f} | {cell:.2f} | {accuracy[key] - cell:+.2f} | no |" in row


def test_the_papers_cells_are_looked_up_by_data_precision_and_angle():
    assert paper.paper_table1("fashion-mnist", "int8*", "ElasticZO k=1 (ZO-Feat-Cls2)") == 77.93
    assert paper.paper_table1("fashion-mnist", "int8*", "Full BP") is None
    assert paper.paper_table1("fashion-mnist-val10000", "fp32", "Full ZO") is None      # a split is no paper cell
    assert paper.paper_table2("fashion-mnist-rot45", "int8", "Full BP") == 80.86      # the calibrated angles
    assert paper.paper_table2("mnist-rot30-sub1000", "fp32", "w/o fine-tuning") == 74.41   # and subset
    assert paper.paper_table2("mnist-rot30", "fp32", "w/o fine-tuning") == 74.41
    assert paper.paper_table2("fashion-mnist-rot60", "fp32", "Full ZO") is None


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(json.loads(FIXTURE.read_text())["first_epoch"]) if FIXTURE.is_file() else [])
def test_one_epoch_of_a_tuned_configuration_gives_its_recorded_first_epoch_loss(tmp_path, capsys, native, key):
    """The paper suite's job of `key` (method, precision, runtime), as the suite now tunes it, for
    one epoch: its training loss is the first epoch's of the reproduction run (FP32 to float
    tolerance, INT8 bit for bit)."""
    recorded = json.loads(FIXTURE.read_text())["first_epoch"][key]
    suite, method, precision, zo_loss, runtime = key.split()
    r = cli(capsys, "run", "--suite", suite, "--method", method, "--precision", precision, "--runtime", runtime,
            "--target", "local-1t", "--set", "epochs=1", "--no-report", "--results", tmp_path,
            *(["--dataset", "fashion-mnist"] if suite == "paper-finetune" else []))
    assert r.returncode == 0, r.stderr
    store = Store(tmp_path)
    (result,) = [x for x in store.results(store.latest()) if x["job"]["zo_loss"] == zo_loss
                 and x["job"]["method"] == method.partition(":")[0] and not x["job"]["job_id"].startswith("pretrain")
                 and x["job"]["workload"].get("rotate", 0) == recorded.get("rotate", 0)]
    assert result["job"]["hyper"] == {**result["job"]["hyper"], **recorded["hyper"]}
    loss = result["epochs"][0]["train_loss"]
    assert loss == (recorded["train_loss"] if precision == "int8" else pytest.approx(recorded["train_loss"], rel=1e-4))


def test_a_cell_over_seeds_is_their_mean_and_standard_deviation_judged_by_the_mean(tmp_path):
    """Made-up Full ZO FP32 results of three seeds (76, 78 and 80%; seed 1's two repeats agree)
    and one of another cell's single seed: the first is 78.00 ± 2.00 over 3 seeds, +0.91 from the
    paper's 77.09 and so within 2 points, though one seed alone is not; a single seed shows no spread."""
    from reports import report

    store = Store(tmp_path)
    results = []
    for seed, repeat, acc in ((0, 0, 0.76), (1, 0, 0.78), (1, 1, 0.78), (2, 0, 0.80)):
        r = made_up_result(1.0, repeat=repeat)
        r["job"] = {**r["job"], "seed": seed, "job_id": f"{r['job']['job_id']}.s{seed}"}
        r["epochs"] = [{**r["epochs"][0], "test_accuracy": acc}]
        results.append(r)
    one = made_up_result(1.0, method="full-bp")
    one["epochs"] = [{**one["epochs"][0], "test_accuracy": 0.9140}]
    run_id = made_up_run(store, [*results, one])
    df = report._load(store, [run_id], [store.run_plan(run_id)])
    t = paper.table1(report._chart_groups(df)).set_index("method")
    zo = t.loc["Full ZO"]
    assert (zo["zobench %"], zo["paper %"], zo["difference (points)"], zo["within 2 points"]) == \
        ("78.00 ± 2.00 (3 seeds)", "77.09", "+0.91", "yes")
    bp = t.loc["Full BP"]
    assert (bp["zobench %"], bp["difference (points)"]) == ("91.40", "+0.03")


def test_run_seed_sets_every_jobs_seed_over_the_suites_and_resume_refuses_it(tmp_path, capsys, native):
    """A cell over seeds is one run per seed: --seed gives every job (and the pretraining a
    fine-tuning suite starts from) that seed, and so other initial weights."""
    results = tmp_path / "results"
    args = ("run", "--suite", "quick-finetune", "--runtime", "cpp", "--precision", "fp32", "--method", "full-bp",
            "--target", "local-1t", "--no-report", "--set", "epochs=1", "--set", "train_samples=64",
            "--set", "test_samples=32", "--results", results)
    inits = {}
    for seed in (None, 3):
        p = cli(capsys, *args, *(("--seed", seed) if seed is not None else ()))
        assert p.returncode == 0, p.stderr
        store = Store(results)
        rs = store.results(store.latest())
        assert {r["job"]["seed"] for r in rs} == {seed or 0} and len(rs) > 1
        inits[seed] = {r["model"]["init_sha256"] for r in rs if r["job"].get("save_weights")}
    assert inits[None] != inits[3]
    p = cli(capsys, "run", "--resume", store.latest(), "--seed", "4", "--results", results)
    assert p.returncode == 2 and "takes no suite, target, filter, --set or --seed" in p.stderr


def test_torch_is_set_beside_the_cpp_run_of_its_own_data_set(tmp_path):
    """MNIST's Full ZO rate is Fashion-MNIST's (1.47e-4 both): made-up runs of one hyper on both
    data sets and torch on Fashion-MNIST alone, the MNIST run listed last. torch's row is set
    beside the Fashion-MNIST C++ run (30%), not the MNIST one (20%) that shares its hyper."""
    reproduce = script("reproduce.py")
    store = Store(tmp_path)
    results = []
    for runtime, data, acc in (("cpp", "fashion-mnist", 0.30), ("torch", "fashion-mnist", 0.31), ("cpp", "mnist", 0.20)):
        r = made_up_result(1.0)
        r["job"] = {**r["job"], "runtime": runtime, "job_id": f"{runtime}.{data}",
                    "workload": {**r["job"]["workload"], "dataset": data}}
        r["epochs"] = [{**r["epochs"][0], "test_accuracy": acc}]
        results.append(r)
    rows = reproduce.agreement(store, [made_up_run(store, results)])
    assert rows[["method", "data", "cpp test %", "torch test %"]].values.tolist() == \
        [["Full ZO", "fashion-mnist", "30.00", "31.00"]]


# -- records: every number of the generated part is a committed record's, or says it has none --

reproduce = script("reproduce.py")


def test_every_generated_section_of_the_doc_is_what_the_committed_records_give_or_says_its_records_were_lost():
    """docs/reproduction.md's generated part, section by section, against what the committed
    records (docs/reproduction/records.jsonl.gz) build, no run needed: a section the records do not
    give stands only where it is marked LOST and names the command that makes its runs again."""
    text = reproduce.DOC.read_text()
    assert reproduce.stale(text, reproduce.committed()) == [], \
        "regenerate it from the committed records: python scripts/reproduce.py doc"
    for title, lines in reproduce.written(text).items():
        if lines[0] == reproduce.LOST:
            assert "scripts/reproduce.py" in "\n".join(lines[:2]), title


def test_a_number_without_its_record_makes_the_doc_stale():
    """The check above on the doc with a number added to a section the records build (Table 2's),
    one before the first section, and one in Table 1 (as the first line: were the section marked
    LOST, the mark would no longer lead it): each is named."""
    text = reproduce.DOC.read_text()
    edited = text.replace("### Table 2\n\n", "### Table 2\n\nFull BP, mnist: 96.17%\n\n", 1) \
        .replace(reproduce.BEGIN + "\n", reproduce.BEGIN + "\nFull ZO: 73.70%\n", 1) \
        .replace("### Table 1\n\n", "### Table 1\n\nFull ZO, mnist: 89.80%\n\n", 1)
    assert reproduce.stale(edited, reproduce.committed()) == ["", "Table 1", "Table 2"]


def test_a_reproduction_rebuilds_its_tables_from_its_records_alone(tmp_path, capsys, native):
    """A real reproduction in small (paper-fmnist's Full ZO FP32 on 256 images, its 100 epochs: the
    C++ run and torch's), through the script: its records written, then the doc rebuilt in a fresh
    folder from the records file alone gives every table the runs give, and the records made again
    from the runs are the same bytes."""
    doc = tmp_path / "a" / "reproduction.md"
    doc.parent.mkdir()
    doc.write_text(reproduce.DOC.read_text())
    fixture = FIXTURE.read_bytes()
    records_file = tmp_path / "records.jsonl.gz"
    rc = reproduce.main(["run", "--suite", "paper-fmnist", "--method", "full-zo", "--precision", "fp32", "--seeds", "0",
                         "--set", "train_samples=256", "--set", "test_samples=100", "--results", str(tmp_path / "r"),
                         "--records", str(records_file), "--doc", str(doc)])
    assert rc == 0, capsys.readouterr().err
    store = Store(tmp_path / "r")
    run_ids = json.loads((tmp_path / "r" / "reproduce.json").read_text())["runs"]
    assert sorted(store.results(i)[0]["job"]["runtime"] for i in run_ids) == ["cpp", "torch"]
    from harness.stores import records
    recs = records.read(records_file)
    for rec in recs:
        (r,) = store.results(rec["run_id"])
        assert rec["spec_sha256"] == r["spec_sha256"] and len(rec["epochs"]) == 100
        assert [e["test_accuracy"] for e in rec["epochs"]] == [e["test_accuracy"] for e in r["epochs"]]
        assert rec["cell"]["dataset"] == "fashion-mnist" and rec["cell"]["seed"] == 0
    from_runs = reproduce.sections(store, sorted(run_ids))
    assert from_runs["Table 1"] and from_runs[TORCH]      # the two runs make both tables
    assert reproduce.written(doc.read_text()) == reproduce.written(
        reproduce.generated(from_runs, reproduce.DOC.read_text()))
    assert (doc.parent / "reproduction" / "loss.png").is_file()
    # a fresh folder: the records and the doc, no results
    fresh = tmp_path / "b" / "reproduction.md"
    fresh.parent.mkdir()
    fresh.write_text(reproduce.DOC.read_text())
    assert reproduce.main(["doc", "--records", str(records_file), "--doc", str(fresh),
                           "--results", str(tmp_path / "none")]) == 0
    assert fresh.read_text() == doc.read_text() and not (tmp_path / "none").exists()
    assert reproduce.stale(fresh.read_text(), recs) == []
    # the records step made again from the runs: the same bytes
    again = tmp_path / "again.jsonl.gz"
    assert reproduce.main(["records", *run_ids, "--results", str(tmp_path / "r"), "--records", str(again)]) == 0
    assert again.read_bytes() == records_file.read_bytes()
    assert FIXTURE.read_bytes() == fixture      # a run not at the suite's tuning leaves the slow test's entries


def test_a_tune_runs_trials_are_its_own_section_rebuilt_from_records_never_a_cell(tmp_path, capsys, native):
    """A real search in small (Full ZO FP32, three rates, three epochs on 256 images, 200 held out):
    its records give "Validation searches", a row per trial with its last epoch's validation
    accuracy, the trial the search chose in bold; a doc rebuilt in a fresh folder from the
    records alone gives the same; and no trial on the validation split is a cell of Table 1."""
    results = tmp_path / "r"
    p = start("tune", "--suite", "paper-fmnist", "--method", "full-zo", "--precision", "fp32", "--runtime", "cpp",
            "--target", "local-1t", "--epochs", "3", "--sampler", "grid", "--grid-points", "3",
            "--param", "lr_zo=1e-4:1e-2", "--validation", "200", "--set", "train_samples=256",
            "--set", "test_samples=100", "--no-report", "--results", results)
    _, err = p.communicate()
    assert p.returncode == 0, err
    store = Store(results)
    run_id = store.latest()
    search = store.run_plan(run_id)["tune"]
    records_file, doc = tmp_path / "records.jsonl.gz", tmp_path / "a" / "reproduction.md"
    doc.parent.mkdir()
    doc.write_text(reproduce.DOC.read_text())
    assert reproduce.main(["doc", run_id, "--results", str(results), "--records", str(records_file),
                           "--doc", str(doc)]) == 0
    section = reproduce.written(doc.read_text())["Validation searches"]
    assert section[0].startswith(f"`zobench tune --suite paper-fmnist --method full-zo") and f"`{run_id}`" in section[0]
    rows = {line.split(" | ")[0].strip("| *"): line for line in section if line.startswith("| ") and "---" not in line}
    del rows["lr_zo"]
    assert len(rows) == len(search["trials"]) == 3
    for trial in search["trials"]:
        row = rows[f"{trial['values']['lr_zo']:g}"]
        assert f" | {100 * trial['validation_accuracy'][-1]:.2f} | " in row
        assert row.startswith("| **") == (trial["values"] == search["best"]["values"])
    fresh = tmp_path / "b" / "reproduction.md"
    fresh.parent.mkdir()
    fresh.write_text(reproduce.DOC.read_text())
    assert reproduce.main(["doc", "--records", str(records_file), "--doc", str(fresh)]) == 0
    assert reproduce.written(fresh.read_text())["Validation searches"] == section
    assert reproduce.sections(store, [run_id])["Table 1"] is None
    # a search stopped before its end (its last trial interrupted, not pruned) chose nothing
    from harness.stores import records
    recs = records.read(records_file)
    recs[-1] = {**recs[-1], "status": "interrupted", "error": "interrupted by SIGINT; the runner's process group was killed"}
    with reproduce.recorded(recs) as (rebuilt, ids):
        stopped = reproduce.sections(rebuilt, ids)["Validation searches"]
    lines = "\n".join(stopped).splitlines()
    assert "it chose nothing" in lines[0] and not any("| **" in line for line in lines)
    assert any(line.endswith("| interrupted: interrupted by SIGINT |") for line in lines)


def test_a_fine_tuning_search_holds_its_pretraining_yet_stays_a_search_never_a_table_2_cell():
    """A search of paper-finetune (its committed records: Full ZO FP32 on Fashion-MNIST at 30
    degrees, seven rates) holds the pretraining job its trials start from, which trains on no
    validation split: the run is still a search, its trials rows of "Validation searches" and
    the pretraining none, and no trial a cell of Table 2."""
    from harness.stores import records
    run_id = "20261205-105255-2089"
    recs = [x for x in records.read(reproduce.RECORDS) if x["run_id"] == run_id]
    assert any(x["job"]["job_id"].startswith("pretrain.") for x in recs)
    with reproduce.recorded(recs) as (store, ids):
        out = reproduce.sections(store, ids)
    assert out["Table 2"] is None and out["Table 1"] is None and out["Runs"] is None
    lines = "\n".join(out["Validation searches"]).splitlines()
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 7 and sum("**" in row for row in rows) == 1
    assert next(row for row in rows if "**" in row).startswith("| **0.000316** |")
