"""Final weights as a file and a run that starts from one (issue 15's fine-tuning, its runner
half): save_weights writes exactly the bytes weights_sha256 hashes, init_weights reads them
back in every runtime and precision, and a bad file is refused with its reason."""
import hashlib

import pytest

from testkit.runners import TORCH_RUNNER, job_spec, run_runner

RUNTIMES = [("torch", "fp32"), ("cpp", "fp32"), ("torch", "int8"), ("cpp", "int8")]


def spec(data_dir, precision, seed=3, **fields):
    return job_spec("elastic-zo", 1, seed=seed, steps=12, test_samples=64, data_dir=data_dir, precision=precision,
                    **fields)


def command(runtime, native):
    return native if runtime == "cpp" else TORCH_RUNNER


@pytest.fixture(scope="module")
def pretrained(native, data_dir, tmp_path_factory):
    """Per precision, a torch run's result and final weights file."""
    out = {}
    for precision in ("fp32", "int8"):
        folder = tmp_path_factory.mktemp(f"pretrain-{precision}")
        out[precision] = run_runner(spec(data_dir, precision, save_weights=True), folder), folder / "weights.bin"
    return out


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_saved_weights_are_the_bytes_the_result_hashes(pretrained, precision):
    result, path = pretrained[precision]
    assert result["model"]["weights_file"] == "weights.bin"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == result["model"]["weights_sha256"]
    assert result["model"]["init_sha256"] != result["model"]["weights_sha256"]   # it trained


@pytest.mark.parametrize("runtime,precision", RUNTIMES)
def test_a_run_starts_from_the_file_and_runtimes_agree_on_where_it_ends(native, pretrained, data_dir, tmp_path,
                                                                        runtime, precision):
    _, path = pretrained[precision]
    fine = spec(data_dir, precision, init_weights=str(path), seed=4)
    r = run_runner(fine, tmp_path / runtime, command(runtime, native))
    assert r["status"] == "ok", r["error"]
    assert r["model"]["init_sha256"] == pretrained[precision][0]["model"]["weights_sha256"]
    assert "weights_file" not in r["model"] and not (tmp_path / runtime / "weights.bin").exists()
    if runtime == "cpp":    # the torch runner's fine-tuning from the same file, bit for bit (fp32: float sums differ)
        t = run_runner(fine, tmp_path / "torch")
        if precision == "int8":
            assert r["model"]["weights_sha256"] == t["model"]["weights_sha256"]
        else:
            assert r["trace"][0]["loss"] == pytest.approx(t["trace"][0]["loss"], rel=1e-5)


@pytest.mark.parametrize("runtime,precision", RUNTIMES)
def test_a_file_of_the_wrong_layout_is_refused_by_name(native, pretrained, data_dir, tmp_path, runtime, precision):
    other = pretrained["int8" if precision == "fp32" else "fp32"][1]
    r = run_runner(spec(data_dir, precision, init_weights=str(other)), tmp_path, command(runtime, native))
    assert r["status"] == "failed"
    assert r["error"].startswith(f"init_weights: {other}")
    assert ("bytes" if precision == "int8" else "float32") in r["error"]


@pytest.mark.parametrize("runtime", ["torch", "cpp"])
def test_an_int8_file_holding_minus_128_is_refused(native, pretrained, data_dir, tmp_path, runtime):
    data = bytearray(pretrained["int8"][1].read_bytes())
    data[5] = 0x80
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(data))
    r = run_runner(spec(data_dir, "int8", init_weights=str(bad)), tmp_path / "run", command(runtime, native))
    assert r["status"] == "failed" and "-128" in r["error"]
