"""Bad input: one line naming the file/key and what was expected, exit code 2, no traceback.
The many refusals of one kind run the CLI's main() in the test's process (testkit.runners.cli);
the rest, a `zobench` process each, as a user runs it."""
import os
import typing

import pytest

from workloads.spec import Hyper
from testkit.runners import REPO, cli, no_mnist, zobench

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
    (["--set", "zo_scale=0"], ["--set zo_scale=0: zo_scale: expected a value >= 1 and <= 127, got 0"]),
    (["--set", "zo_scale=128"], ["--set zo_scale=128: zo_scale: expected a value >= 1 and <= 127, got 128"]),
    (["--set", "lr_decay=1.5"], ["--set lr_decay=1.5: lr_decay: expected a value > 0 and <= 1, got 1.5"]),
    (["--set", "epochs=1000000"], ["epochs: expected a value >= 1 and <= 10000, got 1000000"]),
    (["--set", "batch_size=65"], ["--set batch_size=65: batch_size: expected at most the 64 training samples"]),
    (["--timeout", "-5"], ["argument --timeout: expected a value > 0 and <= 2592000, got -5.0"]),
    (["--timeout", "0"], ["argument --timeout: expected a value > 0"]),
    (["--timeout", "nan"], ["argument --timeout: expected a finite number, got nan"]),
    (["--timeout", "inf"], ["argument --timeout: expected a finite number, got inf"]),
    (["--target", "local", "--target", "local"], ["target 'local' is named twice"]),
    (["--resume", "20990101-000000-dead"], ["unknown run '20990101-000000-dead'"]),
    (["--bogus"], ["unrecognized arguments: --bogus"]),
])
def test_bad_command_line(tmp_path, capsys, args, needles):
    extra = [] if "--resume" in args else QUICK
    check_user_error(cli(capsys, "run", "--results", tmp_path, *args, *extra), *needles)
    assert not (tmp_path / "runs").exists()       # nothing was started


FLOAT_HYPERS = [k for k, t in typing.get_type_hints(Hyper).items() if t is float]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOAT_HYPERS)
def test_every_float_hyperparameter_must_be_finite(tmp_path, capsys, key, value):
    """A NaN learning rate once ran to the end as `ok`, with NaN losses."""
    check_user_error(cli(capsys, "run", "--results", tmp_path, "--set", f"{key}={value}", *QUICK),
                     f"--set {key}={value}: {key}: expected a finite number, got {value}")


@pytest.mark.parametrize("key,split,size", [("train_samples", "train", 60000), ("test_samples", "test", 10000)])
def test_more_samples_than_the_data_set_holds_is_refused_not_cut(tmp_path, key, split, size):
    """The runners would take the samples there are while the stored spec kept the larger number."""
    p = zobench("run", "--results", tmp_path, "--set", "epochs=1", "--set", f"{key}=999999999")
    check_user_error(p, f"--set {key}=999999999: {key}: expected at most the {size} samples of "
                        f"fashion-mnist {split} (0 = all of them), got 999999999")
    assert not (tmp_path / "runs").exists()


def test_a_cpp_board_needs_its_arch(tmp_path):
    inv = write(tmp_path, "inventory.toml", '[targets.pi]\nhost = "h"\nruntimes = ["cpp"]\n')
    check_user_error(zobench("run", "--results", tmp_path, "--target", "pi", "--inventory", inv, *QUICK),
                     f"{inv}: targets.pi.arch: missing; the cpp runtime is built for the board's arch, "
                     "one of x86_64, aarch64")


@pytest.mark.parametrize("args,needles", [
    (["memory", "--batch", "32", "--method", "elastic-zo", "--bp-layers", "0"],
     ["zobench memory: argument --bp-layers: expected a value >= 1, got 0"]),
    (["memory", "--batch", "0"], ["zobench memory: argument --batch: expected a value >= 1"]),
    (["memory", "--batch", "lots"], ["zobench memory: argument --batch: expected an integer, got 'lots'"]),
    (["compare", "a", "b", "--threshold", "nan"], ["argument --threshold: expected a finite number, got nan"]),
    (["compare", "a", "b", "--threshold", "-1"], ["argument --threshold: expected a value >= 0 and <= 1000"]),
])
def test_bad_numbers_in_other_commands(capsys, args, needles):
    check_user_error(cli(capsys, *args), *needles)


@pytest.mark.parametrize("text,needles", [
    ('methods = ["full-zo"]\ntimeout_s = = 3\n', ["malformed TOML", "line 2"]),
    ('methods = ["full-zo"]\nrepeat = 2\n', ["repeat: unknown key", "repeats"]),
    ('methods = ["full-zo"]\nrepeats = "2"\n', ["repeats: expected an integer, got '2'"]),
    ('methods = []\n', ["methods: expected a non-empty list"]),
    ('methods = ["full-zo", "zo-sgd"]\n', ["methods: expected one of", "'zo-sgd'"]),
    ('precisions = ["fp8"]\nmethods = ["full-zo"]\n', ["precisions: expected one of 'fp32', 'int8', 'bf16', 'fp16'", "'fp8'"]),
    ('methods = ["full-zo"]\n[hyper]\nbatch_size = 0\n', ["hyper.batch_size: expected a value >= 1", "got 0"]),
    ('methods = ["full-zo"]\n[hyper]\nlr_zo = nan\n', ["hyper.lr_zo: expected a finite number, got nan"]),
    ('methods = ["full-zo"]\n[hyper]\nzo_scale = 128\n', ["hyper.zo_scale: expected a value >= 1 and <= 127"]),
    ('methods = ["full-zo"]\n[hyper]\ntrain_samples = 60001\n',
     ["hyper.train_samples: expected at most the 60000 samples of fashion-mnist train (0 = all of them), got 60001"]),
    ('methods = ["full-zo"]\ntimeout_s = inf\n', ["timeout_s: expected a finite number, got inf"]),
    ('methods = ["full-zo"]\ntimeout_s = -1\n', ["timeout_s: expected a value > 0"]),
    ('methods = ["full-zo"]\nrepeats = 0\n', ["repeats: expected a value >= 1 and <= 1000, got 0"]),
    ('methods = ["full-zo"]\nseed = -1\n', ["seed: expected a value >= 0", "got -1"]),
    ('methods = ["full-zo", "full-zo"]\n', ["methods: expected each value once, got 'full-zo' twice"]),
    ('methods = ["full-zo"]\nprecisions = ["int8"]\nzo_losses = []\n', ["zo_losses: expected a non-empty list"]),
    ('methods = ["full-zo"]\n[hyper]\nlr = 0.1\n', ["hyper.lr: unknown key", "lr_zo"]),
    ('methods = ["full-zo"]\n[workload]\nmodel = "resnet"\n', ["workload.model: expected one of 'lenet5'"]),
    ('timeout_s = 60\n', ["methods: missing"]),
])
def test_bad_suite_file(tmp_path, capsys, text, needles):
    suite = write(tmp_path, "my suite.toml", text)
    check_user_error(cli(capsys, "run", "--results", tmp_path, "--suite", suite), str(suite), *needles)


def test_missing_dataset_is_a_configuration_error(tmp_path):
    suite = write(tmp_path, "mnist.toml", GOOD_SUITE.replace("fashion-mnist", "mnist"))
    offline = {"ZOBENCH_DATA": str(tmp_path), **no_mnist(tmp_path / "home")}
    p = zobench("run", "--results", tmp_path / "res", "--suite", suite, env=offline)
    check_user_error(p, str(suite), "workload.dataset", "mnist", "cannot fetch", "train-images-idx3-ubyte",
                     "ZOBENCH_DATA")
    assert not (tmp_path / "res" / "runs").exists()       # nothing was started


@pytest.mark.parametrize("text,needles", [
    ('[targets.pi]\nhost = "10.0.0.2"\nport = "22"\n', ["targets.pi.port: expected an integer, got '22'"]),
    ('[targets.pi]\nhost = "10.0.0.2"\nport = 99999\n', ["targets.pi.port: expected a value >= 1 and <= 65535, got 99999"]),
    ('[targets.pi]\nhost = "10.0.0.2"\nport = 0\n', ["targets.pi.port: expected a value >= 1"]),
    ('[targets.pi]\nhost = "h"\nthreads = -1\n', ["targets.pi.threads: expected a value >= 0 and <= 1024, got -1"]),
    ('[targets.pi]\nhost = "10.0.0.2"\nhost_key = "yes"\n', ["targets.pi.host_key: expected one of 'strict', 'accept-new'"]),
    ('[targets.pi]\nport = 22\n', ["targets.pi.host: missing"]),
    ('[targets.pi]\nhost = "h"\nprofile = "nosuch"\n', ["targets.pi.profile: expected one of 'jetson-orin-nano'", "got 'nosuch'"]),
    ('[targets.pi]\nhost = "h"\nprofile = "../targets/local"\n', ["targets.pi.profile: expected one of", "'../targets/local'"]),
    ('[targets.pi]\nhost = "h"\narch = "../../../x/evil"\n', ["targets.pi.arch: expected one of 'x86_64', 'aarch64'"]),
    ('[targets."a/b"]\nhost = "h"\n', ["targets: expected a board name of up to 64 letters", "got 'a/b'"]),
    ('[targets.".."]\nhost = "h"\n', ["targets: expected a board name", "got '..'"]),
    ('[targets."lab board"]\nhost = "h"\n', ["targets: expected a board name", "got 'lab board'"]),
    ('[targets.pi]\nhost = "h"\nmem_limit = "lots"\n', ["targets.pi.mem_limit", '"512M"']),
    ('[targets.pi]\nhost = "h"\nmem_limit = "0M"\n', ["targets.pi.mem_limit: expected a size above zero", "'0M'"]),
    ('[targets.pi]\nhost = "h"\nruntimes = ["tflite"]\n', ["targets.pi.runtimes: expected one of"]),
    ('[targets.pi\n', ["malformed TOML"]),
    ('[boards.pi]\nhost = "h"\n', ["boards: unknown key"]),
])
def test_bad_inventory(tmp_path, capsys, text, needles):
    inv = write(tmp_path, "inventory.toml", text)
    check_user_error(cli(capsys, "targets", "list", "--inventory", inv), *needles)


def test_a_toml_file_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    """A suite, an inventory and the user's config.toml (which even `zobench results` reads)."""
    bad = b'description = "caf\xe9"\n'
    for name, args in (("suite.toml", ["run", "--suite"]), ("inventory.toml", ["targets", "list", "--inventory"])):
        (tmp_path / name).write_bytes(bad)
        check_user_error(zobench(*args, tmp_path / name), f"{tmp_path / name}: not UTF-8 text (byte 18: b'\\xe9')")
    config = tmp_path / "home" / ".config" / "zobench" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_bytes(bad)
    check_user_error(zobench("results", "--results", tmp_path / "res", env={"HOME": str(tmp_path / "home")}),
                     f"{config}: not UTF-8 text")


def test_good_inventory_lists_boards_with_profile_defaults(tmp_path):
    inv = write(tmp_path, "inventory.toml",
                '[targets.lab-board_2]\nhost = "192.0.2.7"\nuser = "pi"\nprofile = "local"\ntransport = "ssh"\n')
    p = zobench("targets", "list", "--inventory", inv)
    assert p.returncode == 0, p.stderr
    line = next(l for l in p.stdout.splitlines() if l.startswith("lab-board_2"))
    assert "pi@192.0.2.7" in line and "torch" in line


@pytest.mark.parametrize("command", [["targets", "probe", "pi"], ["run", "--target", "pi", *QUICK]])
def test_a_missing_key_file_is_a_configuration_error_not_an_unreachable_board(tmp_path, command):
    key = tmp_path / "no_such_key"
    inv = write(tmp_path, "inventory.toml", f'[targets.pi]\nhost = "127.0.0.1"\nkey = "{key}"\n')
    p = zobench(*command, "--inventory", inv, "--results", tmp_path / "res")
    check_user_error(p, f"{inv}: targets.pi.key: no such file '{key}'")
    assert not (tmp_path / "res" / "runs").exists()


def test_an_arch_that_climbs_out_of_the_checkout_builds_nothing(tmp_path):
    """arch names the build folder (build/ARCH-static) and the toolchain file CMake runs
    (targets/toolchains/ARCH-linux-gnu.cmake); a path in it once ran this CMake file."""
    marker = tmp_path / "toolchain-ran"
    (tmp_path / "evil-linux-gnu.cmake").write_text(f'file(WRITE "{marker}" "ran")\n')
    arch = "../" * 30 + str(tmp_path / "evil").lstrip("/")    # climbs from either folder to tmp_path
    assert (REPO / "targets" / "toolchains" / f"{arch}-linux-gnu.cmake").resolve() == tmp_path / "evil-linux-gnu.cmake"
    inv = write(tmp_path, "inventory.toml", f'[targets.evil]\nhost = "h"\narch = "{arch}"\nruntimes = ["cpp"]\n')
    check_user_error(zobench("build", "--target", "evil", "--inventory", inv),
                     f"{inv}: targets.evil.arch: expected one of 'x86_64', 'aarch64', got '{arch}'")
    assert not marker.exists() and sorted(os.listdir(tmp_path)) == ["evil-linux-gnu.cmake", "inventory.toml"]


def test_a_data_set_the_binary_cannot_read_is_left_out_with_a_note(tmp_path):
    suite = write(tmp_path, "digits.toml", 'methods = ["full-zo"]\nruntimes = ["ort", "cpp"]\n'
                                           '[workload]\ndataset = "digits"\n')
    p = zobench("run", "--results", tmp_path / "res", "--suite", suite, "--no-report", *QUICK)
    assert p.returncode == 0, p.stderr
    assert "note: left out full-zo fp32 on cpp: the cpp runtime reads mnist, fashion-mnist, modelnet40 and " \
           "modelnet40-synthetic, not digits" in p.stderr.splitlines()
    (run,) = os.listdir(tmp_path / "res" / "runs")
    assert sorted(f for f in os.listdir(tmp_path / "res" / "runs" / run) if f.startswith("local.")) == [
        "local.ort.full-zo.fp32.r0.json"]


def every_option():
    """(command, option strings, its help) of every option of every subcommand, targets' too."""
    import argparse
    from zobench.cli import build_parser

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    yield from walk(p, f"{name} {sub}".strip())
            elif action.option_strings and action.dest != "help":
                yield name, action.option_strings, action.help
    return list(walk(build_parser(), ""))


def test_every_option_of_every_command_says_what_it_is():
    bare = [(command, opts) for command, opts, help_text in every_option() if not help_text]
    assert bare == []


def test_bare_zobench_prints_its_usage_and_version_is_the_packages():
    bare = zobench()
    assert bare.returncode == 2 and bare.stderr.startswith("usage: zobench") and "error" not in bare.stderr
    import importlib.metadata
    v = zobench("--version")
    assert v.returncode == 0 and v.stdout.strip() == f"zobench {importlib.metadata.version('zobench')}"


def test_memory_takes_a_method_as_run_tune_and_fit_do(capsys):
    """--method elastic-zo:K is elastic-zo with --bp-layers K; a K that contradicts --bp-layers,
    or a malformed one, is one line."""
    import json
    k2 = cli(capsys, "memory", "--batch", "8", "--method", "elastic-zo:2", "--json")
    assert k2.returncode == 0, k2.stderr
    same = cli(capsys, "memory", "--batch", "8", "--method", "elastic-zo", "--bp-layers", "2", "--json")
    assert json.loads(k2.stdout) == json.loads(same.stdout) and len(json.loads(k2.stdout)) == 1
    for args, needle in ([["--method", "elastic-zo:2", "--bp-layers", "1"], "--method elastic-zo:2 says 2"],
                         [["--method", "elastic-zo:0"], "K >= 1"], [["--method", "full-zo:1"], "only elastic-zo"]):
        r = cli(capsys, "memory", "--batch", "8", *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr


def test_a_trials_progress_line_says_validation_accuracy():
    """A job with a validation split (a tune trial) scores on held-out training samples: its
    line says "validation acc"; a job of a run says "test acc"."""
    import io
    from rich.console import Console
    from harness.execution.progress import ProgressView

    out = io.StringIO()
    with ProgressView({"local": 2}, Console(file=out, force_terminal=False, width=200)) as view:
        for job_id, validation in (("trial", 1000), ("job", 0)):
            view.job_finished("local", {"status": "ok", "steps": 10, "train_seconds": 1.0,
                                        "epochs": [{"test_accuracy": 0.5}],
                                        "job": {"job_id": job_id, "workload": {"validation": validation}}})
    lines = out.getvalue().splitlines()
    assert "trial  100.00 ms/step, validation acc 0.500" in lines[0] and "job  100.00 ms/step, test acc 0.500" in lines[1]
