"""The CPU zobench-train is built for: read by the probe from /proc/cpuinfo, chosen per board
(harness/planning/cpu.py), pinned by a profile or the inventory, built once per CPU a run, recorded in
every cpp result, its fingerprint and the report's machine table.

tests/fixtures/cpuinfo/ holds /proc/cpuinfo as five real machines print it: an AVX2 x86 (AMD
EPYC 7B12, Zen 2), an AVX-512 VNNI x86 (Intel Xeon Platinum 8375C, Ice Lake), a Raspberry Pi
Zero 2 W (4x Cortex-A53), a Raspberry Pi 5 (4x Cortex-A76) and a Jetson Orin Nano (6x
Cortex-A78AE)."""
import os
import platform
import threading
from pathlib import Path

import pandas as pd
import pytest

from harness.preparation import bundle
from harness.planning import counting, cpu
from harness.analysis import compare
from harness.planning import inventory
from harness.preparation.build import build_name, cpu_choice
from harness.errors import UserError
from harness.planning.inventory import Target
from harness.stores.measurements import Measurement, fingerprint
from harness.stores.store import Store
from reports.report import _machine
from workloads.envinfo import cpu_facts
from zobench.cli import main

from testkit.runners import SHORT
from testkit.sshd import board_toml
from testkit.tools import require

FIXTURES = Path(__file__).parent / "fixtures" / "cpuinfo"
# fixture -> (arch, parts the probe reads, the CPU chosen, the flags it is built with)
MACHINES = {
    "amd-epyc-7b12-avx2": ("x86_64", [], "x86-64-v3", ["-march=x86-64-v3"]),
    "intel-xeon-8375c-avx512-vnni": ("x86_64", [], "x86-64-v4-vnni", ["-march=x86-64-v4", "-mavx512vnni"]),
    "raspberry-pi-zero-2-w": ("aarch64", ["0x41:0xd03"], "cortex-a53", ["-mcpu=cortex-a53"]),
    "raspberry-pi-5": ("aarch64", ["0x41:0xd0b"], "cortex-a76", ["-mcpu=cortex-a76"]),
    "jetson-orin-nano": ("aarch64", ["0x41:0xd42"], "cortex-a78ae", ["-mcpu=cortex-a78ae"]),
}


def probed(name: str) -> dict:
    return cpu_facts((FIXTURES / f"{name}.txt").read_text())


def board(arch: str, **kw) -> Target:
    return Target(name="b", host="h", arch=arch, runtimes=["cpp"], **kw)


@pytest.mark.parametrize("name", MACHINES)
def test_the_probe_reads_the_flags_every_core_has_and_each_kind_of_core(name):
    arch, parts, _, _ = MACHINES[name]
    facts = probed(name)
    assert facts["cpu_parts"] == parts
    assert facts["cpu_flags"] == sorted(facts["cpu_flags"]) and len(set(facts["cpu_flags"])) == len(facts["cpu_flags"])
    first = next(l for l in (FIXTURES / f"{name}.txt").read_text().splitlines() if l.startswith(("flags", "Features")))
    assert facts["cpu_flags"] == sorted(first.split(":", 1)[1].split())      # every processor lists the same
    assert ("avx2" in facts["cpu_flags"]) == (arch == "x86_64")
    assert ("asimddp" in facts["cpu_flags"]) == (name in ("raspberry-pi-5", "jetson-orin-nano"))


@pytest.mark.parametrize("name", MACHINES)
def test_the_build_variant_chosen_for_each_probed_cpu(name):
    arch, _, expected, flags = MACHINES[name]
    choice = cpu.choose(arch, probed(name))
    assert choice.cpu == expected and choice.why.startswith("probed")
    assert cpu.flags(arch, choice.cpu) == flags
    assert cpu_choice(board(arch), probed(name)) == choice
    assert build_name(board(arch), choice.cpu) == f"{arch}-{expected}"


def test_every_arm_core_named_is_one_gcc_tunes_for():
    assert set(cpu.ARM_PARTS.values()) <= set(cpu.ARM_CORES)
    assert all(set(pair.split(".")) <= set(cpu.ARM_CORES) for pair in cpu.BIG_LITTLE)


@pytest.mark.parametrize("parts,features,expected", [
    (["0x41:0xd05", "0x41:0xd0b"], "asimddp", "cortex-a76.cortex-a55"),    # RK3588: gcc's big.LITTLE pair
    (["0x41:0xd03", "0x41:0xd08"], "", "cortex-a72.cortex-a53"),          # RK3399
    (["0x41:0xd05", "0x41:0xd41", "0x41:0xd44"], "asimddp", "armv8.2-a+dotprod"),   # X1 + A78 + A55: no pair
    (["0x41:0xd03", "0x41:0xd0b"], "", "armv8-a"),          # a mix with no pair, without the dot product
    (["0x41:0xd80"], "asimddp", "armv8.2-a+dotprod"),       # Cortex-A520: an Arm core not named here
    (["0x51:0x805"], "asimddp", "armv8.2-a+dotprod"),       # another implementer's core (Qualcomm Kryo)
    (["0x61:0x022"], "", "armv8-a"),                        # an unknown core without the dot product
    (["0x41:0xd0b"], "asimddp", "cortex-a76"),
])
def test_mixed_and_unknown_arm_cores_get_the_architecture_all_of_them_run(parts, features, expected):
    base = "fp asimd evtstrm crc32 cpuid" + (" atomics asimdrdm " + features if features else "")
    assert cpu.choose("aarch64", {"cpu_flags": base.split(), "cpu_parts": parts}).cpu == expected


def test_dotprod_alone_is_not_enough_for_armv8_2():
    """-march=armv8.2-a also emits the v8.1 atomics and RDM: a core must list them too."""
    facts = {"cpu_flags": ["fp", "asimd", "crc32", "asimddp"], "cpu_parts": ["0x51:0x805"]}
    assert cpu.choose("aarch64", facts).cpu == "armv8-a"


@pytest.mark.parametrize("arch,facts", [("x86_64", {}), ("aarch64", {}), ("x86_64", {"cpu_flags": [], "cpu_parts": []})])
def test_a_probe_without_cpu_facts_gets_the_baseline_and_says_why(arch, facts):
    """A probe from before envinfo read them, or a board whose /proc/cpuinfo could not be read."""
    choice = cpu.choose(arch, {"arch": arch, "cores": 4, **facts})
    assert choice == cpu.Choice(cpu.BASELINE[arch], cpu.NO_FACTS)
    assert "no CPU facts" in choice.why


def test_a_pinned_cpu_wins_over_the_probe_and_the_local_target_is_native(tmp_path):
    inv = tmp_path / "inventory.toml"
    inv.write_text('[targets.pi]\nprofile = "pi-zero2"\nhost = "h"\n'
                   '[targets.pi5]\nprofile = "pi-zero2"\nhost = "h"\ncpu = "cortex-a76"\n'
                   '[targets.unpinned]\nprofile = "pi-zero2"\nhost = "h"\ncpu = ""\n'
                   '[targets.orin]\nprofile = "jetson-orin-nano"\nhost = "h"\n')
    t = inventory.load(inv)
    assert (t["pi"].cpu, t["pi5"].cpu, t["unpinned"].cpu, t["orin"].cpu) == ("cortex-a53", "cortex-a76", "", "cortex-a78ae")
    assert t["local"].cpu == ""
    pi5 = probed("raspberry-pi-5")
    assert cpu_choice(t["pi"], pi5) == cpu.Choice("cortex-a53", "pinned by the target's cpu key")
    assert cpu_choice(t["pi"]) == cpu_choice(t["pi"], pi5)        # known before the probe: built up-front
    assert cpu_choice(t["unpinned"]) is None and cpu_choice(t["unpinned"], pi5).cpu == "cortex-a76"
    assert cpu_choice(t["local"]).cpu == cpu.NATIVE == build_name(t["local"])
    pinned_here = Target(name="local", transport="local", arch="x86_64", cpu="x86-64-v3")
    assert cpu_choice(pinned_here, probed("intel-xeon-8375c-avx512-vnni")).cpu == "x86-64-v3"


@pytest.mark.parametrize("table,needles", [
    ('host = "h"\narch = "aarch64"\ncpu = "cortex-a99"\n', ["targets.pi.cpu: expected one of armv8-a, ",
                                                           "cortex-a53", "for aarch64, got 'cortex-a99'"]),
    ('host = "h"\narch = "x86_64"\ncpu = "cortex-a53"\n', ["targets.pi.cpu: expected one of x86-64, x86-64-v2",
                                                          "for x86_64, got 'cortex-a53'"]),
    ('profile = "pi-zero2"\nhost = "h"\narch = "x86_64"\n', ["targets.pi.cpu:", "got 'cortex-a53'"]),
    ('host = "h"\ncpu = "x86-64-v3"\n', ["targets.pi.cpu: a pinned cpu needs the target's arch, one of x86_64, aarch64"]),
    ('host = "h"\narch = "aarch64"\ncpu = "../../x"\n', ["targets.pi.cpu: expected one of", "got '../../x'"]),
])
def test_a_bad_pin_is_one_line_naming_the_file_the_key_and_the_names_allowed(tmp_path, capsys, table, needles):
    inv = tmp_path / "inventory.toml"
    inv.write_text("[targets.pi]\n" + table)
    assert main(["targets", "list", "--inventory", str(inv)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"zobench: error: {inv}: ")
    for n in needles:
        assert n in line, line
    with pytest.raises(UserError, match="cpu: expected one of"):
        cpu.choose("aarch64", {}, "x86-64-v3")


def test_boards_of_one_cpu_share_one_build_and_its_content_id(monkeypatch, tmp_path):
    """Boards ask for their binary from their own threads after their probes: one build per
    variant (the others wait for it), its content id computed once, a failure kept for all."""
    calls, ids = [], []
    # each build waits here for the other variant's: built one after the other, they never meet
    both = threading.Barrier(2, timeout=60)

    def fake_build(target, cpu_name, stop=None):
        calls.append(cpu_name)
        both.wait()                 # the other boards ask while it builds
        if cpu_name == "cortex-a76":
            raise UserError("building zobench-train (aarch64-cortex-a76) failed: no compiler")
        path = tmp_path / cpu_name
        path.write_text(cpu_name)
        return path

    def fake_id(path):
        ids.append(path.name)
        return ("sha-" + path.name, 1)

    monkeypatch.setattr(bundle, "build", fake_build)
    monkeypatch.setattr(bundle, "content_id", fake_id)
    binaries, got = bundle.Binaries(), {}
    asks = [("a", "cortex-a53"), ("b", "cortex-a53"), ("c", "cortex-a53"), ("d", "cortex-a76"), ("e", "cortex-a76")]

    def ask(name, cpu_name):
        got[name] = binaries.get(board("aarch64"), cpu.Choice(cpu_name, "probed"))

    threads = [threading.Thread(target=ask, args=a) for a in asks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(calls) == ["cortex-a53", "cortex-a76"] and ids == ["cortex-a53"]
    assert not both.broken          # the two variants built side by side, not one after the other
    assert {got[n].id for n in "abc"} == {("sha-cortex-a53", 1)} and got["a"].error == ""
    assert got["d"].error == got["e"].error == "building zobench-train (aarch64-cortex-a76) failed: no compiler"
    assert got["d"].path is None


def test_the_build_cpu_and_kernels_are_in_the_fingerprint_and_older_results_still_compare():
    env = {"cpu_model": "AMD EPYC 7B12", "cores": 4, "governor": "performance", "kernel": "6.1.0", "versions": {}}
    avx2 = {"conv": "avx2-fma", "fc": "avx2-fma", "int8": "avx2-maddubs", "zrng": "avx2-maddubs"}

    def m(**extra):
        return Measurement("k", {}, [1.0], [1.0], [], fingerprint({**env, **extra}), "", "")

    new = m(build_cpu="x86-64-v3", kernels=avx2)
    assert compare.fingerprint_changes(new, m(build_cpu="x86-64-v3", kernels=avx2)) == []
    assert compare.fingerprint_changes(new, m(build_cpu="x86-64-v4", kernels=avx2)) == ["build_cpu"]
    assert compare.fingerprint_changes(new, m(build_cpu="x86-64-v3", kernels={**avx2, "int8": "scalar"})) == ["kernels"]
    assert compare.fingerprint_changes(m(), new) == compare.fingerprint_changes(new, m()) == []   # a result from before
    assert compare.fingerprint_changes(m(), m(governor="powersave")) == ["governor"]


def test_the_machine_table_shows_the_build_cpu_and_kernels_where_a_job_recorded_them():
    env = {"hostname": "pi", "arch": "aarch64", "cpu_model": "Cortex-A76", "cores": 4, "governor": "performance",
           "kernel": "6.6", "versions": {"python": "3.11"}}
    cpp = {**env, "build_cpu": "cortex-a76", "kernels": {"conv": "neon", "int8": "neon-dotprod"}}
    _, table = _machine(pd.DataFrame({"target": ["pi", "pi"], "env": [env, cpp]}))
    assert list(table.columns[-2:]) == ["built for", "kernels"]
    assert table[["built for", "kernels"]].values.tolist() == [["-", "-"], ["cortex-a76", "conv neon, int8 neon-dotprod"]]
    _, older = _machine(pd.DataFrame({"target": ["pi"], "env": [env]}))
    assert "built for" not in older.columns and "kernels" not in older.columns


def test_a_boards_cpp_job_runs_the_binary_built_for_the_cpu_its_probe_found(farm, tmp_path, capsys):
    """Over SSH to a loopback board (this machine): the run probes it, builds the static binary
    for the CPU its /proc/cpuinfo names (here: the best x86 level it reaches), deploys it and
    records the choice; `zobench build` makes the same choice. The board counts instructions
    (`instructions = "callgrind"`): the binary Valgrind runs is deployed beside the timed one and
    counted there, with the board's valgrind, through the same SSH connection."""
    require("cmake", "g++", "nlohmann/json.hpp", "valgrind")
    arch = platform.machine()
    here = cpu.choose(arch, cpu_facts(Path("/proc/cpuinfo").read_text()))
    inv = tmp_path / "inventory.toml"
    inv.write_text(board_toml("board-a", farm["boards"]["board-a"], farm["key"], tmp_path / "work",
                              runtimes=["cpp"], arch=arch, instructions="callgrind"))
    assert main(["run", "--results", str(tmp_path / "results"), "--inventory", str(inv), "--target", "board-a",
                 "--method", "full-zo", "--no-report", *SHORT]) == 0
    store = Store(tmp_path / "results")
    (r,) = store.results(store.latest())
    assert r["status"] == "ok", r["error"]
    assert (r["env"]["build_cpu"], r["env"]["build_cpu_reason"]) == (here.cpu, here.why)
    assert r["env"]["probe"]["cpu_flags"]
    assert r["env"]["binary_sha256"]
    counted = r["instructions"]
    assert counted["why"] is None and counted["build"] == counting.counted_build(arch, here.cpu), counted
    assert counted["per_step"] > 1e5 and len(counted["step_totals"]) == counting.COUNT_STEPS
    assert sum(counted["phases"].values()) == pytest.approx(counted["per_step"], rel=1e-9)
    capsys.readouterr()
    assert main(["build", "--target", "board-a", "--inventory", str(inv)]) == 0
    out = capsys.readouterr().out
    assert f"/build/{arch}-{here.cpu}-" in out and out.rstrip().endswith(f"cpu {here.cpu}: {here.why}")
    assert f"sha256 {r['env']['binary_sha256']}" in out


def working_in(folder: Path) -> list[tuple[str, str]]:
    """(pid, command) of every process whose working folder is in folder: a build's make and
    compilers run in its build folder."""
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(d / "cwd")).is_relative_to(folder):
                out.append((d.name, (d / "comm").read_text().strip()))
        except OSError:
            pass
    return out


def test_a_stopped_build_kills_its_compiler_and_leaves_nothing_running(monkeypatch, tmp_path):
    """A run stopped while a board's binary builds (SIGTERM during `zobench run`) stops the build
    at once: the real cmake and compiler, in a build folder of their own, are killed as soon as
    the Stop is set, and the build ends in BuildStopped (one line), not after the compiler."""
    from harness import paths
    from harness.boards.transport import Stop
    from harness.preparation import build as builds

    monkeypatch.setattr(paths, "REPO", tmp_path)     # a fresh folder: a real build from nothing
    stop, compiling = Stop(), threading.Event()

    def stop_once_it_compiles():
        while not stop.is_set():
            if any(comm.startswith(("cc1plus", "c++", "g++")) for _, comm in working_in(tmp_path)):
                compiling.set()
                stop.request("interrupted by SIGTERM")
            threading.Event().wait(0.05)

    watcher = threading.Thread(target=stop_once_it_compiles, daemon=True)
    watcher.start()
    with pytest.raises(builds.BuildStopped, match=r"^building zobench-train \(native\) stopped: interrupted by SIGTERM$"):
        builds.build(Target(name="local", transport="local", arch=platform.machine()), stop=stop)
    watcher.join(timeout=60)
    assert compiling.is_set() and working_in(tmp_path) == []
    assert not list((tmp_path / "build").glob("*/zobench-train"))      # no binary came of it


# zobench's CLI with its build folder (paths.REPO/build) in a fresh folder: a real build from nothing
FRESH_BUILD = ("import sys; from pathlib import Path; from harness import paths; paths.REPO = Path(sys.argv[1]); "
               "from zobench.cli import main; sys.exit(main(sys.argv[2:]))")


@pytest.mark.parametrize("command", [["build", "--target", "pinned"],
                                     ["run", "--target", "pinned", "--suite", "quick", "--runtime", "cpp", "--no-report"]])
def test_sigterm_during_a_pinned_build_kills_the_compilers_and_says_so(tmp_path, command):
    """Issue 47: SIGTERM while a pinned CPU's binary builds (`zobench build --target`, or `run`'s
    preparation) is handled as SIGINT is: the real cmake and compilers are killed before zobench
    ends, with one line and exit 143, and a run is not started."""
    import signal
    import subprocess
    import sys

    from testkit.runners import REPO, until
    inv = tmp_path / "inv.toml"
    inv.write_text('[targets.pinned]\nprofile = "local"\ncpu = "x86-64-v2"\n')
    (tmp_path / "workloads").symlink_to(REPO / "workloads")       # the sources, built in tmp_path/build
    proc = subprocess.Popen([sys.executable, "-c", FRESH_BUILD, str(tmp_path), *command, "--inventory", str(inv),
                             *(["--results", str(tmp_path / "results")] if command[0] == "run" else [])],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    until("the compiler to start", lambda: any(comm.startswith(("cc1plus", "c++", "g++")) for _, comm in working_in(tmp_path)),
          proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert working_in(tmp_path) == [] and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "interrupted by SIGTERM" in last and "stopped" in last, err
    assert not (tmp_path / "results" / "runs").exists() or not list((tmp_path / "results" / "runs").iterdir())
