"""Rotated data sets (Rotated MNIST / Fashion-MNIST, the ElasticZO paper's fine-tuning study):
turned once on the host, exactly and deterministically, the labels kept; every runtime reads the
same rotated files, here and on a board, and a runner refuses images turned by another angle.
The study's subsets (N images drawn from each split) are drawn once on the host, the same for
every angle and runtime."""
from pathlib import Path

import numpy as np
import pytest

from harness.preparation import artifacts, bundle
from harness.planning import plan, suites
from harness.errors import UserError
from harness.planning.inventory import Target
from harness.planning.runs import Job
from harness.boards.transport import LocalTransport
from workloads import datasets, zrng
from workloads.spec import JobSpec

from testkit.agreement import assert_same_fp32_steps
from testkit.runners import TORCH_RUNNER, cli, job_spec, no_mnist, run_runner, small_mnist

STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# a 4x4 block of 200s centred 8 pixels right of the image's centre (13.5, 13.5): the first training image
BLOCK = (slice(12, 16), slice(20, 24))


@pytest.fixture
def mnist(tmp_path, monkeypatch) -> dict[str, bytes]:
    """A small MNIST (320 train, 64 test) of random pixels in $ZOBENCH_DATA/mnist, the first
    training image the off-centre BLOCK, and an empty cache of its own (artifacts.root()
    follows HOME); returns each file's bytes by stem."""
    def block(prefix, images):
        if prefix == "train":
            images[0] = 0
            images[0][BLOCK] = 200

    folder = small_mnist(tmp_path, monkeypatch, 320, 64, 5, block)
    return {stem: (folder / stem).read_bytes() for stem in STEMS}


def images(r: artifacts.DataFiles, prefix: str) -> np.ndarray:
    return datasets.read_idx(r.files[f"mnist/{prefix}-images-idx3-ubyte"])


def test_data_names():
    assert datasets.data_name("fashion-mnist", 30.0) == "fashion-mnist-rot30"
    assert datasets.data_name("mnist", 22.5) == "mnist-rot22.5"
    assert datasets.data_name("mnist", -60.0) == "mnist-rot-60"
    assert datasets.data_name("mnist", 0.0) == datasets.data_name("mnist", 360.0) == "mnist"


@pytest.mark.parametrize("degrees", [0.0, 360.0, -360.0])
def test_a_whole_turn_is_the_data_set_byte_for_byte(mnist, degrees):
    r = artifacts.rotated_idx("mnist", "", degrees)
    assert r == artifacts.raw_idx("mnist", "")
    assert {rel: p.read_bytes() for rel, p in r.files.items()} == {f"mnist/{s}": b for s, b in mnist.items()}
    assert not (r.dir / "mnist" / datasets.ROTATION_FILE).exists()


@pytest.mark.parametrize("degrees,quarter_turns", [(90.0, 1), (180.0, 2), (-90.0, -1), (270.0, 3)])
def test_quarter_turns_are_exactly_np_rot90_counter_clockwise(mnist, degrees, quarter_turns):
    """Bilinear rotation about the centre moves pixel centres onto pixel centres at multiples of
    90 degrees, so after rounding every pixel, the borders too, is np.rot90's."""
    raw, r = artifacts.raw_idx("mnist", ""), artifacts.rotated_idx("mnist", "", degrees)
    for prefix in ("train", "t10k"):
        np.testing.assert_array_equal(images(r, prefix), np.rot90(images(raw, prefix), quarter_turns, axes=(1, 2)))
        assert r.files[f"mnist/{prefix}-labels-idx1-ubyte"].read_bytes() == mnist[f"{prefix}-labels-idx1-ubyte"]
    if degrees == 90.0:     # counter-clockwise as displayed (row 0 on top): right of the centre goes up
        assert [tuple(x) for x in np.argwhere(images(r, "train")[0])] == [(y, x) for y in range(4, 8)
                                                                            for x in range(12, 16)]


def test_30_degrees_is_deterministic_and_moves_a_pattern_where_the_geometry_says(mnist, monkeypatch):
    first = artifacts.rotated_idx("mnist", "", 30.0)
    assert first.dir.name.startswith("mnist-rot30-") and first.dir.parent == artifacts.root() / artifacts.DATA
    made = {rel: p.read_bytes() for rel, p in first.files.items()}
    assert set(made) == {*(f"mnist/{s}" for s in STEMS), "mnist/rotation"}
    assert made["mnist/rotation"] == b"30.0\n"
    for stem in ("train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"):
        assert made[f"mnist/{stem}"] == mnist[stem]
    # made again from nothing: the same folder, the same bytes
    for p in first.files.values():
        p.unlink()
    again = artifacts.rotated_idx("mnist", "", 30.0)
    assert again.dir == first.dir and {rel: p.read_bytes() for rel, p in again.files.items()} == made
    # the block 8 px right of the centre turns 30 degrees counter-clockwise: 4 px up, 8 cos 30 right
    turned = images(first, "train")[0].astype(float)
    ys, xs = np.indices(turned.shape)
    mass = turned.sum()
    assert mass == pytest.approx(16 * 200, rel=0.02)
    assert (ys * turned).sum() / mass == pytest.approx(13.5 - 8 * np.sin(np.pi / 6), abs=0.05)
    assert (xs * turned).sum() / mass == pytest.approx(13.5 + 8 * np.cos(np.pi / 6), abs=0.05)
    assert images(first, "t10k").shape == (64, 28, 28)
    # another angle, or another rotation rule, is another folder; the first one stays as it was
    assert artifacts.rotated_idx("mnist", "", 60.0).dir != first.dir
    monkeypatch.setattr(artifacts, "ROTATION", "a-new-rule")
    assert artifacts.rotated_idx("mnist", "", 30.0).dir != first.dir
    assert {rel: p.read_bytes() for rel, p in first.files.items()} == made


def rotated_spec(data_dir, rotate: float, steps: int = 10) -> dict:
    """Full BP of LeNet-5 on the fake MNIST turned by `rotate`, read from data_dir."""
    s = job_spec("full-bp", 0, seed=3, steps=steps, test_samples=64, data_dir=str(data_dir), dataset="mnist")
    s["workload"]["rotate"] = rotate
    return s


def test_torch_and_cpp_train_on_the_same_rotated_pixels(mnist, native, tmp_path):
    s = rotated_spec(artifacts.rotated_idx("mnist", "", 30.0).dir, 30.0)
    torch, cpp = run_runner(s, tmp_path / "torch"), run_runner(s, tmp_path / "cpp", native)
    assert_same_fp32_steps(torch, cpp, 10)
    # and those pixels are not the unrotated ones: from the same weights, losses that differ by
    # ten times the tolerance the two runtimes agree within (rtol 1e-4 of a loss of ~2.3)
    plain = run_runner(rotated_spec(artifacts.raw_idx("mnist", "").dir, 0.0), tmp_path / "plain", check=True)
    assert plain["model"]["init_sha256"] == torch["model"]["init_sha256"]
    lp, lt = (np.array([x["loss"] for x in r["trace"]]) for r in (plain, torch))
    assert np.abs(lp - lt).mean() > 1e-3


@pytest.mark.parametrize("runtime", ["torch", "cpp"])
def test_a_runner_refuses_images_turned_by_another_angle(mnist, request, tmp_path, runtime):
    raw, rot30 = artifacts.raw_idx("mnist", ""), artifacts.rotated_idx("mnist", "", 30.0)
    command = request.getfixturevalue("native") if runtime == "cpp" else TORCH_RUNNER
    cases = [(raw.dir, 30.0, f"{raw.dir}/mnist holds unrotated images (no rotation file), but workload.rotate is 30"),
             (rot30.dir, 60.0, f"{rot30.dir}/mnist holds images rotated by 30 degrees, but workload.rotate is 60"),
             (rot30.dir, 0.0, f"{rot30.dir}/mnist holds images rotated by 30 degrees, but workload.rotate is 0")]
    for i, (folder, rotate, error) in enumerate(cases):
        r = run_runner(rotated_spec(folder, rotate, steps=2), tmp_path / str(i), command)
        assert r["status"] == "failed" and r["steps"] == 0
        assert f"dataset 'mnist': {error}; the harness makes the rotated files (harness/preparation/artifacts.py " \
               "rotated_idx)" in r["error"]
    # a whole turn needs no rotation file
    assert run_runner(rotated_spec(raw.dir, 360.0, steps=2), tmp_path / "whole", command, check=True)["steps"] == 2


def suite_file(tmp_path: Path, model: str, dataset: str, rotate) -> Path:
    p = tmp_path / "rotated.toml"
    p.write_text(f'methods = ["full-zo"]\nruntimes = ["torch"]\nprecisions = ["fp32"]\n'
                 f'[workload]\nmodel = "{model}"\ndataset = "{dataset}"\nrotate = {rotate}\n'
                 '[hyper]\nepochs = 1\ntrain_samples = 64\ntest_samples = 32\n')
    return p


@pytest.mark.parametrize("model,dataset,why", [("pointnet", "modelnet40-synthetic", "point clouds"),
                                               ("lenet5", "digits", "made by scikit-learn")])
def test_the_plan_refuses_rotating_what_is_not_an_idx_image_set(tmp_path, model, dataset, why):
    s = suites.load(str(suite_file(tmp_path, model, dataset, 30)))
    with pytest.raises(UserError) as e:
        plan.make(s, [Target(name="local", transport="local")])
    assert str(e.value) == (f"{s.path}: dataset '{dataset}': workload.rotate = 30: only the images of mnist and "
                            f"fashion-mnist are rotated, not {dataset} ({why})")


def test_an_angle_past_a_whole_turn_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"workload\.rotate: expected a value >= -360 and <= 360, got 400\.0"):
        suites.load(str(suite_file(tmp_path, "lenet5", "mnist", 400)))


def test_a_missing_mnist_is_one_line_saying_how_to_get_it(tmp_path, monkeypatch, capsys):
    """No MNIST here, none fetched before (a HOME of its own) and no index answering."""
    monkeypatch.setenv("ZOBENCH_DATA", str(tmp_path / "empty"))
    for key, value in no_mnist(tmp_path / "home").items():
        monkeypatch.setenv(key, value)
    p = cli(capsys, "run", "--results", tmp_path / "res", "--suite", suite_file(tmp_path, "lenet5", "mnist", 30))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("zobench: error: ") and "workload.dataset: dataset 'mnist': cannot fetch" in line
    assert line.endswith(datasets.HOW_TO_GET["mnist"])
    assert not (tmp_path / "res" / "runs").exists()


def jobs_of(target: str, *rotations: float) -> list[Job]:
    """A torch job on target per angle, of the fake MNIST."""
    out = []
    for rotate in rotations:
        spec = {**rotated_spec("", rotate), "runtime": "torch", "target": target, "job_id": f"rot{rotate:g}"}
        out.append(Job(spec["job_id"], target, 60.0, JobSpec.from_dict(spec).to_dict()))
    return out


def test_a_local_run_gives_rotated_jobs_the_rotated_folder_and_others_their_own(mnist):
    plain, turned = jobs_of("local", 0.0, 30.0)
    local = Target(name="local", transport="local")
    prepared = bundle.prepare([plain, turned], {"local": local})["local"]
    rot30 = artifacts.rotated_idx("mnist", "", 30.0)
    # here a torch job reads the unrotated images where they are: only the rotated variant is made
    assert {rel: p for rel, p in prepared.files.items() if rel.startswith("data/")} == {
        f"data/mnist-rot30/{rel}": p for rel, p in rot30.files.items()}
    site = bundle.open_site(local, LocalTransport(), prepared, None, Path("jobs"), "run")
    assert site.job_spec(turned.spec)["workload"]["data_dir"] == str(rot30.dir)
    assert site.job_spec(plain.spec)["workload"]["data_dir"] == ""


class Board:
    """A transport to a board that is never reached: deploy is replaced."""

    def connect(self):
        pass

    def path(self, p: str) -> str:
        return p


def test_a_board_gets_each_variant_in_a_folder_of_its_own(mnist, monkeypatch):
    plain, turned = jobs_of("pi", 0.0, 30.0)
    board = Target(name="pi", host="pi.invalid", workdir="/w")
    prepared = bundle.prepare([plain, turned], {"pi": board})["pi"]
    raw, rot30 = artifacts.raw_idx("mnist", ""), artifacts.rotated_idx("mnist", "", 30.0)
    assert {rel: p for rel, p in prepared.files.items() if rel.startswith("data/")} == {
        **{f"data/mnist/{rel}": p for rel, p in raw.files.items()},
        **{f"data/mnist-rot30/{rel}": p for rel, p in rot30.files.items()}}
    assert prepared.ids["data/mnist-rot30/mnist/rotation"] == artifacts.content_id(rot30.dir / "mnist" / "rotation")
    monkeypatch.setattr(bundle, "deploy", lambda transport, workdir, files, ids: "/w/bundles/b")
    site = bundle.open_site(board, Board(), prepared, None, Path("jobs"), "run")
    assert site.job_spec(turned.spec)["workload"]["data_dir"] == "/w/bundles/b/data/mnist-rot30"
    assert site.job_spec(plain.spec)["workload"]["data_dir"] == "/w/bundles/b/data/mnist"


def test_a_subset_is_n_samples_of_each_split_drawn_once_the_same_at_every_angle(mnist):
    """zrng.holdout's draws: each split's own, kept in order, nested (a larger subset holds every
    sample of a smaller one), and the same indices at every angle, so the 60-degree subset is
    the 30-degree subset's images turned by another angle, with the same labels."""
    raw = artifacts.raw_idx("mnist", "")
    a, b = artifacts.subset_idx("mnist", "", 0.0, 40), artifacts.subset_idx("mnist", "", 0.0, 50)
    assert a.dir.name.startswith("mnist-sub40-") and (a.dir / "mnist" / datasets.SUBSET_FILE).read_text() == "40\n"
    for prefix, n, seed in (("train", 320, 1), ("t10k", 64, 2)):
        keep = zrng.holdout(n, 40, seed)
        assert len(keep) == 40 and np.all(np.diff(keep) > 0)
        np.testing.assert_array_equal(images(a, prefix), images(raw, prefix)[keep])
        assert set(map(bytes, images(a, prefix))) <= set(map(bytes, images(b, prefix)))
    assert not np.array_equal(zrng.holdout(64, 40, 1), zrng.holdout(64, 40, 2))   # the splits draw apart
    r30, r60 = artifacts.subset_idx("mnist", "", 30.0, 40), artifacts.subset_idx("mnist", "", 60.0, 40)
    for prefix in ("train", "t10k"):
        np.testing.assert_array_equal(images(r30, prefix), artifacts.rotate_images(images(a, prefix), 30.0))
        np.testing.assert_array_equal(images(r60, prefix), artifacts.rotate_images(images(a, prefix), 60.0))
        for r in (r30, r60):
            assert r.files[f"mnist/{prefix}-labels-idx1-ubyte"].read_bytes() == \
                a.files[f"mnist/{prefix}-labels-idx1-ubyte"].read_bytes()
    assert (r30.dir / "mnist" / datasets.ROTATION_FILE).read_text() == "30.0\n"
    assert artifacts.subset_idx("mnist", "", 30.0, 0) == artifacts.rotated_idx("mnist", "", 30.0)
    with pytest.raises(datasets.DatasetError, match="workload.subset: expected at most the 64 samples"):
        artifacts.subset_idx("mnist", "", 0.0, 65)


def subset_spec(data_dir, subset: int, steps: int = 2) -> dict:
    s = rotated_spec(data_dir, 30.0, steps)
    s["workload"]["subset"] = subset
    s["hyper"]["test_samples"] = 0
    return s


@pytest.mark.parametrize("runtime", ["torch", "cpp"])
def test_both_runtimes_read_the_subset_and_refuse_any_other_folder(mnist, request, tmp_path, runtime):
    command = request.getfixturevalue("native") if runtime == "cpp" else TORCH_RUNNER
    sub = artifacts.subset_idx("mnist", "", 30.0, 40)
    whole, other = artifacts.rotated_idx("mnist", "", 30.0), artifacts.subset_idx("mnist", "", 30.0, 48)
    spec = subset_spec(sub.dir, 40, steps=0)
    spec["hyper"]["batch_size"] = 8
    r = run_runner(spec, tmp_path / "ok", command, check=True)
    assert r["steps"] == 5                              # one epoch of its 40 training images
    assert (40 * r["epochs"][-1]["test_accuracy"]) % 1 == pytest.approx(0, abs=1e-9)      # of its 40 test images
    for i, (folder, has) in enumerate(((whole.dir, "the whole splits (no subset file)"),
                                       (other.dir, "a subset of 48 samples a split"))):
        r = run_runner(subset_spec(folder, 40), tmp_path / str(i), command)
        assert r["status"] == "failed" and f"holds {has}, but workload.subset is 40" in r["error"]


def test_the_plan_draws_the_subset_for_fine_tuning_not_for_pretraining(mnist, tmp_path):
    p = tmp_path / "finetune.toml"
    p.write_text('methods = ["full-zo"]\nruntimes = ["torch"]\nprecisions = ["fp32"]\nrotations = [30, 60]\n'
                 '[workload]\ndataset = "mnist"\nsubset = 40\n[hyper]\nepochs = 1\nbatch_size = 8\n'
                 '[pretrain]\ntarget = "local"\nruntime = "torch"\n')
    jobs, _ = plan.make(suites.load(str(p)), [Target(name="local", transport="local")])
    pre, *tuned = jobs
    assert pre.spec["workload"]["subset"] == 0 and pre.spec["workload"]["rotate"] == 0.0
    assert [(j.spec["workload"]["subset"], j.job_id.split(".")[-2]) for j in tuned] == [
        (40, "mnist-rot30-sub40"), (40, "mnist-rot60-sub40")]
    p.write_text(p.read_text().replace("subset = 40", "subset = 65"))
    with pytest.raises(UserError, match=r"workload.subset: expected at most the 64 samples of mnist's smaller split, "
                                        r"got 65"):
        plan.make(suites.load(str(p)), [Target(name="local", transport="local")])
