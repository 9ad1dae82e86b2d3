"""The GPU path, where torch sees CUDA (CI has no GPU and skips this file; run it on a GPU
machine with `pytest tests/test_cuda.py`): the ZO parts' steps on the device, the dense ones
replayed as one CUDA graph with every scalar on the device, the sparse and Forward-Grad ones
eager, step for step against the CPU's."""
import pytest
import torch

from testkit.agreement import assert_same_fp32_steps
from testkit.runners import job_spec, run_runner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")

# every estimator, update rule and sparsity, with one query and several, on full-zo and under
# ElasticZO's partition (the head's SGD or Adam inside the same graph)
CASES = [("full-zo", 0, {}),
         ("full-zo", 0, {"zo_update": "sign", "zo_queries": 3}),
         ("elastic-zo", 1, {"zo_update": "momentum", "zo_estimator": "one-sided"}),
         ("full-zo", 0, {"zo_update": "conservative"}),
         ("elastic-zo", 1, {"zo_update": "conservative", "zo_estimator": "one-sided", "zo_queries": 2}),
         ("elastic-zo", 2, {"zo_update": "adam", "optimizer": "adam"}),
         ("full-zo", 0, {"zo_update": "adam", "zo_queries": 2}),
         ("full-zo", 0, {"zo_sparsity": "layers", "zo_layers": 2, "zo_update": "momentum"}),
         ("elastic-zo", 1, {"zo_sparsity": "magnitude", "zo_mask_every": 10, "zo_update": "sign"}),
         ("full-zo", 0, {"zo_estimator": "forward-grad"}),
         ("elastic-zo", 1, {"zo_estimator": "forward-grad", "zo_update": "adam"})]


@pytest.mark.parametrize("method,k,parts", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_the_gpu_steps_each_combination_as_the_cpu_does(tmp_path, method, k, parts):
    s = job_spec(method, k, seed=3, steps=30, hyper=dict(parts, lr_zo=2e-3, warmup_steps=5))
    cpu = run_runner(s, tmp_path / "cpu")
    gpu = run_runner({**s, "device": "cuda"}, tmp_path / "gpu")
    assert gpu["job"]["device"] == "cuda"
    assert_same_fp32_steps(cpu, gpu, 30)


def test_a_device_memory_cap_on_a_device_named_without_its_index():
    """A CUDA target's device is "cuda": the cap takes the current device's index (torch's setter
    refuses a device without one, which a lent H200 showed), and a tensor past it is refused."""
    from workloads.torch_runner import cap_device_memory
    cap_device_memory(torch.device("cuda"), 256 * 2**20)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
        torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    finally:
        cap_device_memory(torch.device("cuda"), torch.cuda.get_device_properties(0).total_memory)
