"""Each kernel path of the C++ binary against the torch runner. Every x86 CPU name this machine
runs (harness/planning/cpu.py; a name it cannot run is skipped) is built, names its kernels in
env.kernels, trains FP32 step for step with torch and INT8 bit for bit with the reference:
LeNet-5 (the convolution tiles, pooled as they are made where no activation before the pool is
kept, unpooled for BP with the input gradient's signed tile; the FC dot products over a batch
that is no whole number of 4-image blocks) and PointNet (the pointwise GEMM tile: forward,
weight gradient and the fused global max, over rows and points that leave short tiles and
blocks). The aarch64 builds do the same under qemu: with the dot product (-cpu max) and without
(the Cortex-A53).

make test builds three of them: x86-64 (SSE2, the baseline), x86-64-v3 (AVX2) and both aarch64
paths; the native build every other test runs covers this machine's own (AVX-512 with VNNI on the
CI runner). x86-64-v2, x86-64-v4, x86-64-v4-vnni and x86-64-v3-nofma (AVX2 without FMA, the build
instructions are counted with: tests/test_instructions.py) compile a minute each and run with -m slow."""
import pytest

from harness.preparation.artifacts import raw_idx
from workloads.models import POINTNET

from testkit.agreement import assert_same_fp32_steps, assert_same_int8_run
from testkit.binaries import KERNEL_PATHS_TESTED, aarch64_binary, native_binary, qemu, x86_names_here
from testkit.runners import job_spec, run_runner
from testkit.tools import require

# per x86 CPU name: the FP32 kernels' vector ISA (conv and fc), the INT8 kernels and the FP32
# perturbation's byte sum (zrng)
X86_KERNELS = {
    "x86-64": ("sse2", "sse2-maddwd", "generic"),
    "x86-64-v2": ("sse4.2", "ssse3-maddubs", "ssse3-maddubs"),
    "x86-64-v3": ("avx2-fma", "avx2-maddubs", "avx2-maddubs"),
    "x86-64-v4": ("avx512", "avx512-maddubs", "avx512-maddubs"),
    "x86-64-v4-vnni": ("avx512", "avx512-vnni", "avx512-vnni"),
    "x86-64-v3-nofma": ("avx2", "avx2-maddubs", "avx2-maddubs"),
}
# per Arm CPU name, run under testkit.binaries.qemu: the INT8 kernels and the perturbation's byte sum
ARM = {"armv8.2-a+dotprod": ("neon-dotprod", "neon-dotprod"), "cortex-a53": ("neon-smull", "neon-uaddlp")}

INT8_LENET = [("full-bp", 0, "float"), ("elastic-zo", 2, "integer")]
INT8_POINTNET = [("full-bp", 0, "float"), ("elastic-zo", 1, "integer")]


# the x86 names each test runs: the ones make test leaves to -m slow are marked so
X86_NAMES = [n if n in KERNEL_PATHS_TESTED else pytest.param(n, marks=pytest.mark.slow) for n in X86_KERNELS]


@pytest.fixture(scope="session")
def x86_build():
    """The binary of an x86 CPU name, built once a session; a name this CPU cannot run skips."""
    require("cmake", "g++", "nlohmann/json.hpp")
    made = {}

    def binary(name: str) -> str:
        if name not in x86_names_here():
            pytest.skip(f"this CPU cannot run {name} code")
        if name not in made:
            made[name] = native_binary(name)
        return made[name]
    return binary


@pytest.fixture(scope="module")
def points_dir():
    return str(raw_idx("modelnet40-synthetic", "").dir)


def lenet_spec(method, k, data_dir, precision="fp32", zo_loss="float"):
    # 30 images: the FC kernel's last block of four repeats its final image
    return job_spec(method, k, seed=7, steps=6, batch=30, test_samples=60, data_dir=data_dir, precision=precision,
                    zo_loss=zo_loss)


def pointnet_spec(method, k, zo_loss, data_dir):
    # 5 clouds of 50 points: 250 rows are no whole number of 4- or 6-row tiles (nor of the weight
    # gradient's 4-row groups), 50 points a 48-point block and 2
    return job_spec(method, k, seed=5, steps=4, batch=5, test_samples=10, data_dir=data_dir, model=POINTNET,
                    dataset="modelnet40-synthetic", hyper={"points": 50, "lr_bp": 0.01, "lr_zo": 1e-4},
                    precision="int8", zo_loss=zo_loss)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The torch runner's result of a spec, run once per module."""
    done = {}

    def result(name: str, spec: dict) -> dict:
        if name not in done:
            done[name] = run_runner(spec, tmp_path_factory.mktemp("torch"))
        return done[name]
    return result


@pytest.mark.parametrize("name", X86_NAMES)
def test_x86_build_names_its_kernels_and_trains_fp32_with_torch(x86_build, reference, data_dir, tmp_path, name):
    s = lenet_spec("full-bp", 0, data_dir)
    r = run_runner(s, tmp_path, x86_build(name))
    simd, int8, z = X86_KERNELS[name]
    assert r["env"]["kernels"] == {"conv": simd, "fc": simd, "int8": int8, "zrng": z}
    assert_same_fp32_steps(reference("lenet-fp32", s), r, 6)


@pytest.mark.parametrize("config", INT8_LENET, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", X86_NAMES)
def test_x86_build_is_bit_exact_in_int8_on_lenet5(x86_build, reference, data_dir, tmp_path, name, config):
    s = lenet_spec(*config[:2], data_dir, "int8", config[2])
    assert_same_int8_run(reference(f"lenet-{config}", s), run_runner(s, tmp_path, x86_build(name)))


@pytest.mark.parametrize("config", INT8_POINTNET, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", X86_NAMES)
def test_x86_build_is_bit_exact_in_int8_on_pointnet(x86_build, reference, points_dir, tmp_path, name, config):
    s = pointnet_spec(*config, points_dir)
    assert_same_int8_run(reference(f"pointnet-{config}", s), run_runner(s, tmp_path, x86_build(name)))


@pytest.mark.parametrize("name", ARM)
def test_aarch64_build_under_qemu_names_its_kernels_and_is_bit_exact(reference, data_dir, points_dir, tmp_path, name):
    require("cmake", "aarch64-linux-gnu-g++", "nlohmann/json.hpp", "qemu-aarch64")
    int8, z = ARM[name]
    command = [*qemu(name), aarch64_binary(name)]
    lenet, pointnet = INT8_LENET[1], INT8_POINTNET[0]
    runs = {f"lenet-{lenet}": lenet_spec(*lenet[:2], data_dir, "int8", lenet[2]),
            f"pointnet-{pointnet}": pointnet_spec(*pointnet, points_dir)}
    for i, (ref, s) in enumerate(runs.items()):
        r = run_runner(s, tmp_path / str(i), command)
        assert r["env"]["arch"] == "aarch64"
        assert r["env"]["kernels"] == {"conv": "neon", "fc": "neon", "int8": int8, "zrng": z}
        assert_same_int8_run(reference(ref, s), r)
