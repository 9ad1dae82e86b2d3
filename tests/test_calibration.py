"""Table 2's calibration (reports/calibration.py, scripts/calibrate_table2.py): the fits choose the
grid points a made-up truth says, the seeds' spread is the sample standard deviation, and the
suites the script runs are paper-finetune with only the calibrated settings changed."""
import tomllib

import pytest

from harness.planning import suites
from harness.planning.suites import MethodChoice
from reports import calibration
from harness.stores.store import Store
from testkit import runners
from testkit.runners import REPO


def script():
    return runners.script("calibrate_table2.py")


def curve(slope: float, offset: float) -> dict:
    """Accuracy falling linearly with the angle, every 5 degrees from 0 to 90."""
    return {float(a): 100 - offset - slope * a for a in range(0, 95, 5)}


def test_the_angles_are_the_grid_pair_that_fits_every_w_o_cell_best():
    """Made-up curves of two groups whose paper cells lie on them at 25 and 45 degrees, one cell
    off by a point: the fit picks (25, 45), and its residuals are the measured less the paper's."""
    curves = {("mnist", "fp32"): curve(1.0, 0.0), ("fashion-mnist", "fp32"): curve(2.0, 10.0)}
    paper = {("mnist", "fp32"): (75.0, 55.0), ("fashion-mnist", "fp32"): (40.0, 1.0)}
    fit = calibration.fit_angles(curves, paper)
    assert fit.value == (25.0, 45.0)
    assert fit.residuals == {(("mnist", "fp32"), 25.0): 0.0, (("mnist", "fp32"), 45.0): 0.0,
                             (("fashion-mnist", "fp32"), 25.0): 0.0, (("fashion-mnist", "fp32"), 45.0): -1.0}
    assert fit.sse == 1.0
    with pytest.raises(ValueError, match="fewer than two angles"):
        calibration.fit_angles({("mnist", "fp32"): {30.0: 70.0}}, {("mnist", "fp32"): (70.0, 50.0)})


def test_the_subset_is_the_size_whose_full_bp_cells_fit_best():
    measured = {500: {"mnist": 91.0, "fmnist": 76.0}, 1000: {"mnist": 93.5, "fmnist": 78.5},
                2000: {"mnist": 96.5, "fmnist": 83.0}, 5000: {"mnist": 97.0}}      # 5000: one cell only
    fit = calibration.fit_subset(measured, {"mnist": 94.8, "fmnist": 80.4})
    assert fit.value == (1000,) and fit.residuals == pytest.approx({"mnist": -1.3, "fmnist": -1.9})
    assert fit.sse == pytest.approx(1.3 ** 2 + 1.9 ** 2)
    assert calibration.fit_subset({**measured, 1000: {"mnist": 92.0, "fmnist": 77.0}},
                                  {"mnist": 94.8, "fmnist": 80.4}).value == (2000,)


def test_a_cells_seeds_give_its_mean_and_sample_standard_deviation():
    assert calibration.spread([80.0, 82.0, 84.0]) == (82.0, pytest.approx(2.0))
    assert calibration.spread([77.5]) == (77.5, 0.0)


def test_the_calibration_suites_are_paper_finetune_with_only_what_is_calibrated_changed(tmp_path):
    path = script().suite_file(tmp_path, "angles-fp32", [0.0, 25.0, 45.0], 1000, 2, {"epochs": 1, "train_samples": 32})
    made, base = tomllib.loads(path.read_text()), tomllib.loads(suites.find("paper-finetune").read_text())
    assert made["rotations"] == [0.0, 25.0, 45.0] and made["seed"] == 2 and made["workload"]["subset"] == 1000
    for key in ("methods", "datasets", "precisions", "zo_losses", "pretrain", "targets", "runtimes"):
        assert made[key] == base[key], key
    s = suites.load(str(path))
    for m in ("full-bp", "elastic-zo:1"):                  # the fine-tuning jobs' tables, over the method's rates
        h, h0 = s.hyper_for(MethodChoice.parse(m), "fp32"), suites.load("paper-finetune").hyper_for(
            MethodChoice.parse(m), "fp32")
        assert h == {**h0, "epochs": 1, "train_samples": 32}
    assert s.pretrain.hyper == suites.load("paper-finetune").pretrain.hyper     # the pretraining untouched


def test_the_cells_step_runs_every_method_or_only_those_named(tmp_path):
    """`cells --method full-bp --precisions fp32`: one method's cells again at a new rate, beside
    the round of every cell; each seed's suite is paper-finetune at that seed."""
    s = script()

    def runs(*only: str):
        return s.cell_runs(s.parser().parse_args(["cells", "--angles", "30,45", "--subset", "1000", "--seeds", "0,2",
                                                  "--name", "r", *only]), tmp_path)

    every = runs()
    assert [(n, extra) for n, _, extra in every] == [
        ("r-fp32-s0", ["--precision", "fp32"]), ("r-int8-s0", ["--precision", "int8"]),
        ("r-fp32-s2", ["--precision", "fp32"]), ("r-int8-s2", ["--precision", "int8"])]
    one = runs("--method", "full-bp", "--precisions", "fp32")
    assert [(n, extra) for n, _, extra in one] == [("r-fp32-s0", ["--precision", "fp32", "--method", "full-bp"]),
                                                   ("r-fp32-s2", ["--precision", "fp32", "--method", "full-bp"])]
    made = tomllib.loads(one[1][1].read_text())
    assert made["seed"] == 2 and made["rotations"] == [30.0, 45.0] and made["workload"]["subset"] == 1000


def test_show_gives_the_same_tables_from_the_calibrations_records_alone(tmp_path, capsys, native):
    """A real round of the cells step in small (quick-finetune as the suite of step `cells-fp32-s0`,
    one epoch on 64 images, at 30 and 45 degrees), kept as calibration.json keeps it: `show` prints
    the same table from its records (`records`, then `show --records`) as from its runs."""
    import json
    from testkit.runners import cli

    s = script()
    results = tmp_path / "calibration"
    text = (REPO / "workloads" / "suites" / "quick-finetune.toml").read_text().replace("rotations = [30, 60]",
                                                                                       "rotations = [30, 45]")
    (tmp_path / "cells-fp32-s0.toml").write_text(text)
    r = cli(capsys, "run", "--suite", tmp_path / "cells-fp32-s0.toml", "--runtime", "cpp", "--precision", "fp32",
            "--target", "local-1t", "--no-report", "--set", "epochs=1", "--set", "train_samples=64",
            "--set", "test_samples=32", "--results", results / "runs")
    assert r.returncode == 0, r.stderr
    results.joinpath("calibration.json").write_text(json.dumps({"cells-fp32-s0": [Store(results / "runs").latest()]}))
    assert s.main(["show", "--results", str(results)]) == 0
    from_runs = capsys.readouterr().out
    assert "| fashion-mnist | FP32 | Full ZO | " in from_runs and "(1) | 61.33 |" in from_runs
    path = tmp_path / "calibration.jsonl.gz"
    assert s.main(["records", "--results", str(results), "--records", str(path)]) == 0
    capsys.readouterr()
    assert s.main(["show", "--records", str(path), "--results", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out == from_runs
    assert s.main(["show", "--results", str(tmp_path / "none")]) == 2
    assert "calibration.json: no such file" in capsys.readouterr().err
