"""Energy and a GPU's memory in results, `zobench compare` and the report, on made-up results of
the shape the runners write (no training: the numbers are chosen, so every verdict and table
cell is known exactly): a corrupt energy record is left out like any corrupt result, energy per
step is judged like step time, a cuda job's peak memory is its GPU's, and results from before
any of it still load, compare and report."""
from __future__ import annotations

import json

import pytest

from harness.stores import schema
from harness.stores.store import Store
from reports import build
from workloads.spec import JobSpec

from testkit.compare_runs import made_up_result, made_up_run
from testkit.runners import cli

MIB = 2 ** 20
STEPS_PER_EPOCH = 10
CPP_NO_METER = "the C++ runner reads no power meter"


def with_phases(r: dict) -> dict:
    """r with its training time in one phase, as a runner reports it (the time charts draw phases)."""
    r["phases"] = {"forward": {"seconds": r["train_seconds"], "calls": r["steps"]}}
    return r


def gpu_result(method: str = "full-zo", *, bp_layers: int = 0, repeat: int = 0, step_ms: float = 10.0,
               j_step: float = 0.1, epoch_joules=(None, None, None), accuracy=(0.5, 0.6, 0.7),
               device_peak_mib: float = 100.0) -> dict:
    """An ok torch job on a cuda target "gpu" of three epochs of 10 steps, as the torch runner
    writes it with NVML: the energy of its timed loop, per epoch where given, and the GPU's memory."""
    r = made_up_result(step_ms, repeat=repeat)
    key = f"{method}-k{bp_layers}" if bp_layers else method
    r["job"] = JobSpec.from_dict({"job_id": f"gpu.torch.{key}.fp32.r{repeat}", "method": method, "bp_layers": bp_layers,
                                  "runtime": "torch", "device": "cuda", "threads": 2, "target": "gpu", "repeat": repeat,
                                  "harness_commit": "0123456789ab",
                                  "hyper": {"epochs": 3, "train_samples": 320}}).to_dict()
    steps, seconds = 3 * STEPS_PER_EPOCH, 3 * STEPS_PER_EPOCH * step_ms / 1e3
    r.update(steps=steps, train_seconds=seconds, wall_seconds=seconds + 1.0,
             warmup={"steps": 20, "seconds": 0.4},
             energy={"source": "nvml", "joules": j_step * steps, "joules_per_step": j_step,
                     "avg_power_w": j_step / (step_ms / 1e3), "unavailable": None},
             epochs=[{"epoch": i + 1, "seconds": seconds / 3, "train_loss": 2.0 - i / 2, "test_loss": 2.0 - i / 2,
                      "test_accuracy": acc, "joules": joules}
                     for i, (acc, joules) in enumerate(zip(accuracy, epoch_joules))])
    r["memory"].update(device_peak_bytes=int(device_peak_mib * MIB),
                       device_reserved_peak_bytes=int(2 * device_peak_mib * MIB),
                       device_used_bytes=int((device_peak_mib + 500) * MIB))
    return with_phases(r)


def cpp_result(accuracy: float = 0.9) -> dict:
    """An ok C++ job on the CPU, with the energy record the C++ runner writes: no meter, and why."""
    r = made_up_result(10.0)
    r["epochs"][0]["test_accuracy"] = accuracy
    r.update(warmup={"steps": 2, "seconds": 0.01},
             energy={"source": None, "joules": None, "joules_per_step": None, "avg_power_w": None,
                     "unavailable": CPP_NO_METER})
    return with_phases(r)


def old_result(step_ms: float = 10.0, repeat: int = 0) -> dict:
    """A result as zobench wrote it before warm-up, energy and the GPU memory fields."""
    r = {k: v for k, v in made_up_result(step_ms, repeat=repeat).items()
         if k not in ("energy", "warmup", "start_eval", "nonfinite", "lease", "validity", "convergence")}
    r["schema"] = 1
    r["memory"] = {k: v for k, v in r["memory"].items() if not k.startswith("device_")}
    del r["job"]["hyper"]["warmup_steps"]
    return with_phases(r)


def compare_json(capsys, root, base, cur) -> tuple[int, dict]:
    """compare's exit code and its verdicts by the key's runtime and method ("torch full-zo")."""
    p = cli(capsys, "compare", "--results", root, base, cur, "--format", "json")
    return p.returncode, {"{3} {1}".format(*v["key"].split()): v for v in json.loads(p.stdout)["verdicts"]}


# -- the schema ------------------------------------------------------------------------------

def _break(path: str, value):
    """A change to a result: set the field at a dotted path (a list's index as a number) to value."""
    def change(r):
        node = r
        for k in path.split(".")[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[path.split(".")[-1]] = value
    return change


BAD = {
    "negative joules": (_break("energy.joules", -1.0), "energy.joules: -1.0 is not a finite number >= 0"),
    "text joules": (_break("energy.joules_per_step", "0.1"),
                    'energy.joules_per_step: "0.1" is not a finite number >= 0'),
    "null without a reason": (_break("energy", {"source": None, "joules": None, "joules_per_step": None,
                                                "avg_power_w": None, "unavailable": None}),
                              "energy.joules is null and energy.unavailable gives no reason"),
    "unknown meter": (_break("energy.source", "multimeter"),
                      "energy.source 'multimeter' is not null or one of nvml, rapl, ina3221, tegrastats"),
    "joules without a meter": (_break("energy.source", None), "energy.joules needs its source"),
    "not an object": (_break("energy", [1.0]), "energy must be an object"),
    "epoch joules": (_break("epochs.1.joules", -0.5), "epochs[1].joules: -0.5 is not a finite number >= 0"),
    "device memory": (_break("memory.device_used_bytes", 1.5), "memory.device_used_bytes: 1.5 is not an integer >= 0"),
    "warm-up": (_break("warmup", {"steps": 20}), "warmup needs steps (an integer) and seconds"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_malformed_energy_memory_or_warmup_field_is_a_problem(case):
    change, what = BAD[case]
    r = gpu_result(epoch_joules=(1.0, 1.0, 1.0))
    assert schema.problems(r) == []
    change(r)
    assert schema.problems(r) == [what]


def test_a_result_with_a_malformed_energy_field_is_reported_corrupt_and_left_out(tmp_path, capsys):
    store = Store(tmp_path)
    bad = gpu_result(repeat=1)
    bad["energy"]["joules"] = -3.0
    run_id = made_up_run(store, [gpu_result(repeat=0), bad])
    assert [r["job"]["repeat"] for r in store.results(run_id)] == [0]
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"zobench: warning: {store.runs / run_id / bad['job']['job_id']}.json is corrupt "
                           "(energy.joules: -3.0 is not a finite number >= 0): left out;")


def test_no_meter_with_its_reason_and_results_from_before_energy_are_valid():
    assert schema.problems(cpp_result()) == schema.problems(old_result()) == []
    assert schema.joules_per_step(cpp_result()) is schema.joules_per_step(old_result()) is None
    assert schema.joules_per_step(gpu_result(j_step=0.25)) == 0.25


# -- compare ---------------------------------------------------------------------------------

BASE_J = [0.100, 0.101, 0.102, 0.100, 0.101]
GPU, CPU = "torch full-zo", "cpp full-zo"


def test_a_20_percent_energy_increase_is_a_regression_and_exits_1(tmp_path, capsys):
    """Same step time and memory, 20% more joules per step in every repeat (low noise)."""
    store = Store(tmp_path)
    base = made_up_run(store, [gpu_result(repeat=i, j_step=j) for i, j in enumerate(BASE_J)])
    more = made_up_run(store, [gpu_result(repeat=i, j_step=1.2 * j) for i, j in enumerate(BASE_J)])
    rc, verdicts = compare_json(capsys, tmp_path, base, more)
    assert rc == 1
    v = verdicts[GPU]
    assert v["status"] == "regressed" and v["reason"] == ""
    energy = v["metrics"]["energy"]
    assert energy["significant"] and energy["change"] == pytest.approx(0.2)
    assert (energy["baseline"], energy["current"]) == pytest.approx((0.100, 0.120))
    assert not v["metrics"]["step_time"]["significant"] and not v["metrics"]["peak_memory"]["significant"]
    p = cli(capsys, "compare", "--results", tmp_path, base, more)
    assert p.returncode == 1 and p.stderr == "zobench: compare: fail: 1 of 1 job keys regressed\n"
    head, row = p.stdout.splitlines()[1:]
    assert head.split()[-2:] == ["energy", "note"] and "0.100 -> 0.120 J/step (+20.0%, p=0.011)" in row
    rc, verdicts = compare_json(capsys, tmp_path, more, base)
    assert rc == 0 and verdicts[GPU]["status"] == "improved"


def test_keys_without_energy_are_not_judged_on_it_and_one_sided_energy_is_a_note(tmp_path, capsys):
    store = Store(tmp_path)
    old = made_up_run(store, [old_result(repeat=i) for i in range(5)])
    cpp = made_up_run(store, [{**cpp_result(), "job": old_result(repeat=i)["job"]} for i in range(5)])
    rc, verdicts = compare_json(capsys, tmp_path, old, cpp)
    assert rc == 0 and verdicts[CPU]["status"] == "unchanged" and verdicts[CPU]["reason"] == ""
    assert set(verdicts[CPU]["metrics"]) == {"step_time", "peak_memory"}
    p = cli(capsys, "compare", "--results", tmp_path, old, cpp)
    assert "energy" not in p.stdout.splitlines()[1] and "J/step" not in p.stdout

    metered = made_up_run(store, [gpu_result(repeat=i, j_step=j) for i, j in enumerate(BASE_J)])
    unmetered = [gpu_result(repeat=i, j_step=j) for i, j in enumerate(BASE_J)]
    for r in unmetered:
        r["energy"] = {"source": None, "joules": None, "joules_per_step": None, "avg_power_w": None,
                       "unavailable": "no power meter: NVML's total energy counter is not supported on this GPU"}
    rc, verdicts = compare_json(capsys, tmp_path, made_up_run(store, unmetered), metered)
    v = verdicts[GPU]
    assert rc == 0 and v["status"] == "unchanged" and "energy" not in v["metrics"]
    assert v["reason"] == "energy measured in current only: not judged"


def test_a_cuda_jobs_peak_memory_is_its_gpus_and_a_cpu_jobs_its_rss(tmp_path, capsys):
    """The GPU's allocation grows by 30% and the process's RSS not at all: a regression of the
    cuda key. The CPU key's memory is its RSS."""
    store = Store(tmp_path)
    base = made_up_run(store, [gpu_result(repeat=i, j_step=j) for i, j in enumerate(BASE_J)] +
                       [old_result(repeat=i) for i in range(5)])
    grown = made_up_run(store, [gpu_result(repeat=i, j_step=j, device_peak_mib=130.0) for i, j in enumerate(BASE_J)] +
                        [old_result(repeat=i) for i in range(5)])
    rc, verdicts = compare_json(capsys, tmp_path, base, grown)
    assert rc == 1
    memory = verdicts[GPU]["metrics"]["peak_memory"]
    assert verdicts[GPU]["status"] == "regressed" and memory["measures"] == "device"
    assert (memory["baseline"], memory["current"], memory["significant"]) == (100.0, 130.0, True)
    assert verdicts[CPU]["status"] == "unchanged" and verdicts[CPU]["metrics"]["peak_memory"]["measures"] == "host RSS"


def test_an_export_round_trips_energy_and_gpu_memory_and_an_older_export_still_compares(tmp_path, capsys):
    store = Store(tmp_path / "results")
    run_id = made_up_run(store, [gpu_result(repeat=i, j_step=j) for i, j in enumerate(BASE_J)])
    out = tmp_path / "baseline.json"
    assert cli(capsys, "export", "--results", store.root, "--run", run_id, "--format", "pytest-benchmark",
               "--out", out).returncode == 0
    z = json.loads(out.read_text())["benchmarks"][0]["extra_info"]["zobench"]
    assert z["joules_per_step"] == BASE_J and z["device_peak_bytes"] == [100 * MIB] * 5
    assert compare_json(capsys, store.root, str(out), run_id) == compare_json(capsys, store.root, run_id, run_id)
    p = cli(capsys, "export", "--results", store.root, "--run", run_id, "--format", "csv")
    head, row = (line.split(",") for line in p.stdout.splitlines())
    assert dict(zip(head, row))["median_joules_per_step"] == "0.101"
    assert dict(zip(head, row))["median_device_peak_mib"] == "100.00"

    doc = json.loads(out.read_text())
    for key in ("joules_per_step", "device_peak_bytes"):      # as an export from before them
        del doc["benchmarks"][0]["extra_info"]["zobench"][key]
    out.write_text(json.dumps(doc))
    rc, verdicts = compare_json(capsys, store.root, str(out), run_id)
    v = verdicts[GPU]
    assert rc == 0 and v["status"] == "unchanged" and v["metrics"]["peak_memory"]["measures"] == "host RSS"
    assert v["reason"] == "energy measured in current only: not judged"

    doc["benchmarks"][0]["extra_info"]["zobench"]["joules_per_step"] = [0.1, -0.1]
    out.write_text(json.dumps(doc))
    p = cli(capsys, "compare", "--results", store.root, str(out), run_id)
    assert p.returncode == 2 and p.stderr.endswith("extra_info.zobench.joules_per_step[1]: -0.1 is not >= 0\n")


def test_results_from_before_energy_compare_with_new_ones_under_the_same_key(tmp_path, capsys):
    """A new CPU result's spec has the device's default warm-up resolved in: the same key as
    an old result's, which has none."""
    store = Store(tmp_path)
    old = made_up_run(store, [old_result(repeat=i) for i in range(5)])
    new = made_up_run(store, [cpp_result() | {"job": made_up_result(10.0, repeat=i)["job"]} for i in range(5)])
    assert made_up_result(10.0)["job"]["hyper"]["warmup_steps"] == 2
    rc, verdicts = compare_json(capsys, tmp_path, old, new)
    assert rc == 0 and list(verdicts) == [CPU] and verdicts[CPU]["status"] == "unchanged"
    assert "warmup" not in verdicts[CPU]["key"]


# -- the report ------------------------------------------------------------------------------

@pytest.fixture
def gpu_run(tmp_path):
    """Three methods on a cuda target with NVML, and a C++ job on the CPU without a meter.
    Full BP and ElasticZO measured each epoch's joules; Full ZO only the loop's J/step."""
    store = Store(tmp_path / "results")
    run_id = made_up_run(store, [
        gpu_result("full-bp", j_step=0.3, epoch_joules=(3.0, 3.0, 3.0), accuracy=(0.60, 0.80, 0.85)),
        gpu_result("full-zo", j_step=0.1, accuracy=(0.40, 0.55, 0.70), device_peak_mib=50.0),
        gpu_result("elastic-zo", bp_layers=1, j_step=0.25, epoch_joules=(2.0, 2.5, 2.5), accuracy=(0.50, 0.72, 0.75)),
        cpp_result(accuracy=0.9)])
    return store, run_id


def section(md: str, title: str) -> str:
    return md.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def table_rows(text: str) -> dict:
    """A Markdown table's rows as {(runtime · target, method): {column: cell}}."""
    lines = [l for l in text.splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]
    return {(r["runtime · target"], r["method"]): r for r in rows}


def test_energy_to_the_accuracy_every_method_reaches(gpu_run, tmp_path):
    """X = Full ZO's final 70%: Full BP reaches it at epoch 2 (3 + 3 J measured), ElasticZO at
    epoch 2 (2 + 2.5 J), Full ZO at epoch 3 (0.1 J/step x 10 steps x 3 epochs)."""
    store, run_id = gpu_run
    md = (build(store, [run_id], tmp_path / "r").parent / "report.md").read_text()
    energy = section(md, "Energy")
    assert "X = 70.0% for lenet5/fashion-mnist (the lowest final test accuracy among its charted jobs" in energy
    rows = table_rows(energy)
    got = {m: (r["epoch reached"], r["energy to reach J"], r["J/step"], r["meter"]) for (_, m), r in rows.items()}
    assert got == {"Full BP": ("2", "6.00", "0.3", "nvml"), "Full ZO": ("3", "3.00", "0.1", "nvml"),
                   "ElasticZO k=1 (ZO-Feat-Cls2)": ("2", "4.50", "0.25", "nvml")}
    assert {panel for panel, _ in rows} == {"torch · gpu"}
    assert f"Left out of the energy chart and table: on solo (cpp), {CPP_NO_METER}." in energy


def test_a_given_accuracy_some_never_reach_is_a_dash(gpu_run, tmp_path, capsys):
    store, run_id = gpu_run
    p = cli(capsys, "report", "--results", store.root, "--run", run_id, "--out", tmp_path / "r",
            "--energy-accuracy", "82")
    assert p.returncode == 0, p.stderr
    energy = section((tmp_path / "r" / "report.md").read_text(), "Energy")
    assert "X = 82.0% for lenet5/fashion-mnist (--energy-accuracy)" in energy
    got = {m: (r["epoch reached"], r["energy to reach J"]) for (_, m), r in table_rows(energy).items()}
    assert got == {"Full BP": ("3", "9.00"), "Full ZO": ("-", "-"), "ElasticZO k=1 (ZO-Feat-Cls2)": ("-", "-")}


def test_the_energy_and_gpu_memory_charts_and_columns(gpu_run, tmp_path):
    from reports import charts, report as rep

    store, run_id = gpu_run
    out = build(store, [run_id], tmp_path / "r").parent
    for name in ("energy", "peak_memory"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG") and (out / f"{name}.svg").is_file()
    md = (out / "report.md").read_text()
    assert "(energy.png)" in md and (out / "report.html").read_text().count("<img") == 7
    head = next(l for l in section(md, "Results").splitlines() if l.startswith("|"))
    assert {"J/step", "GPU peak MiB", "peak RSS MiB"} <= {c.strip() for c in head.strip("|").split("|")}

    df = rep._load(store, [run_id], [store.run_plan(run_id)])
    ok, palette = rep._chart_groups(df), rep._method_palette(df)
    titles = [ax.get_title() for ax in charts.peak_memory(ok, palette).axes if ax.get_title()]
    assert sorted(titles) == ["cpp · solo", "torch · gpu: GPU memory"]
    gpu_ax = next(ax for ax in charts.peak_memory(ok, palette).axes if ax.get_title().endswith("GPU memory"))
    assert gpu_ax.get_ylabel() == "peak GPU memory (MiB)"
    assert sorted(round(p.get_height(), 1) for p in gpu_ax.patches) == [50.0, 100.0, 100.0, 550.0, 600.0, 600.0]
    (ax,) = [a for a in charts.energy(ok[ok["j_step"].notna()], palette).axes if a.get_title()]
    assert ax.get_title() == "torch · gpu (meter: nvml)" and [p.get_height() for p in ax.patches] == [0.3, 0.1, 0.25]


def test_a_report_of_results_without_energy_says_so_in_one_line(tmp_path):
    store = Store(tmp_path / "results")
    run_id = made_up_run(store, [old_result(), {**cpp_result(), "job": made_up_result(10.0, method="full-bp")["job"]}])
    out = build(store, [run_id], tmp_path / "r").parent
    energy = section((out / "report.md").read_text(), "Energy").strip()
    assert energy == ("No job measured its energy, so there is no energy chart: on solo (cpp), "
                      f"{CPP_NO_METER}; on solo (cpp), its result records no energy (written before zobench "
                      "measured it).")
    assert not (out / "energy.png").exists() and (out / "peak_memory.png").is_file()
    assert "J/step" not in section((out / "report.md").read_text(), "Results")
