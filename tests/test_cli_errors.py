"""Bad input: one line naming the file/key and what was expected, exit code 2, no traceback."""
import pytest

from conftest import zobench

QUICK = ["--set", "epochs=1", "--set", "train_samples=64", "--set", "test_samples=32"]


def check_user_error(p, *needles):
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("zobench: error: ") and "Traceback" not in p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


GOOD_SUITE = '''methods = ["full-zo"]
[workload]
dataset = "fashion-mnist"
[hyper]
epochs = 1
'''


@pytest.mark.parametrize("args,needles", [
    (["--method", "sgd"], ["--method 'sgd'", "full-bp, full-zo, elastic-zo"]),
    (["--method", "elastic-zo:x"], ["elastic-zo:K"]),
    (["--suite", "nosuch"], ["unknown suite 'nosuch'", "quick"]),
    (["--target", "pi-nowhere"], ["unknown target 'pi-nowhere'", "local"]),
    (["--runtime", "tvm"], ["--runtime 'tvm'", "torch, ort, cpp"]),
    (["--set", "epochs=many"], ["--set epochs=many", "epochs: expected an integer"]),
    (["--set", "epoch=1"], ["epoch: unknown key", "epochs"]),
    (["--set", "epochs"], ["expected KEY=VALUE"]),
    (["--set", "lr_zo=-1"], ["lr_zo: expected a value >= 0"]),
    (["--resume", "20990101-000000-dead"], ["unknown run '20990101-000000-dead'"]),
    (["--bogus"], ["unrecognized arguments: --bogus"]),
])
def test_bad_command_line(tmp_path, args, needles):
    extra = [] if "--resume" in args else QUICK
    check_user_error(zobench("run", "--results", tmp_path, *args, *extra), *needles)


@pytest.mark.parametrize("text,needles", [
    ('methods = ["full-zo"]\ntimeout_s = = 3\n', ["malformed TOML", "line 2"]),
    ('methods = ["full-zo"]\nrepeat = 2\n', ["repeat: unknown key", "repeats"]),
    ('methods = ["full-zo"]\nrepeats = "2"\n', ["repeats: expected an integer, got '2'"]),
    ('methods = []\n', ["methods: expected a non-empty list"]),
    ('methods = ["full-zo", "zo-sgd"]\n', ["methods: expected one of", "'zo-sgd'"]),
    ('precisions = ["fp16"]\nmethods = ["full-zo"]\n', ["precisions: expected one of 'fp32', 'int8'", "'fp16'"]),
    ('methods = ["full-zo"]\n[hyper]\nbatch_size = 0\n', ["hyper.batch_size: expected a value > 0"]),
    ('methods = ["full-zo"]\n[hyper]\nlr = 0.1\n', ["hyper.lr: unknown key", "lr_zo"]),
    ('methods = ["full-zo"]\n[workload]\nmodel = "resnet"\n', ["workload.model: expected one of 'lenet5'"]),
    ('timeout_s = 60\n', ["methods: missing"]),
])
def test_bad_suite_file(tmp_path, text, needles):
    suite = write(tmp_path, "my suite.toml", text)
    check_user_error(zobench("run", "--results", tmp_path, "--suite", suite), str(suite), *needles)


def test_missing_dataset_is_a_configuration_error(tmp_path):
    suite = write(tmp_path, "mnist.toml", GOOD_SUITE.replace("fashion-mnist", "mnist"))
    p = zobench("run", "--results", tmp_path / "res", "--suite", suite, env={"ZOBENCH_DATA": str(tmp_path)})
    check_user_error(p, str(suite), "workload.dataset", "mnist", "train-images-idx3-ubyte", "ZOBENCH_DATA")
    assert not (tmp_path / "res" / "runs").exists()       # nothing was started


@pytest.mark.parametrize("text,needles", [
    ('[targets.pi]\nhost = "10.0.0.2"\nport = "22"\n', ["targets.pi.port: expected an integer, got '22'"]),
    ('[targets.pi]\nhost = "10.0.0.2"\nhost_key = "yes"\n', ["targets.pi.host_key: expected one of 'strict', 'accept-new'"]),
    ('[targets.pi]\nport = 22\n', ["targets.pi.host: missing"]),
    ('[targets.pi]\nhost = "h"\nprofile = "nosuch"\n', ["unknown profile 'nosuch'"]),
    ('[targets.pi]\nhost = "h"\nmem_limit = "lots"\n', ["targets.pi.mem_limit", '"512M"']),
    ('[targets.pi]\nhost = "h"\nruntimes = ["tflite"]\n', ["targets.pi.runtimes: expected one of"]),
    ('[targets.pi\n', ["malformed TOML"]),
    ('[boards.pi]\nhost = "h"\n', ["boards: unknown key"]),
])
def test_bad_inventory(tmp_path, text, needles):
    inv = write(tmp_path, "inventory.toml", text)
    check_user_error(zobench("targets", "list", "--inventory", inv), *needles)


def test_good_inventory_lists_boards_with_profile_defaults(tmp_path):
    inv = write(tmp_path, "inventory.toml",
                '[targets."lab board"]\nhost = "192.0.2.7"\nuser = "pi"\nprofile = "local"\ntransport = "ssh"\n')
    p = zobench("targets", "list", "--inventory", inv)
    assert p.returncode == 0, p.stderr
    line = next(l for l in p.stdout.splitlines() if l.startswith("lab board"))
    assert "pi@192.0.2.7" in line and "torch" in line
