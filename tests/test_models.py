"""Models as data: a network described only in this file trains through the real runners, as
LeNet-5 does; PointNet's layers agree across the engines; bad descriptions name their field."""
import numpy as np
import pytest
import torch

from harness.preparation.artifacts import onnx_graph
from harness.search.memory_model import layer_outputs
from workloads import datasets, int8, methods, models, support, zrng
from harness.preparation import onnx_export
from workloads.clock import PhaseClock
from workloads.models import LENET5, MODELS, POINTNET, Layer, Model, ModelError
from workloads.spec import JobSpec
from workloads.vocab import PAPER_CONFIGS

from testkit.agreement import assert_same_fp32_steps, assert_same_int8_run
from testkit.runners import ORT_RUNNER, TORCH_RUNNER, job_spec, run_runner

# Made up for these tests: kernels of 3 and 4, padding 1 and 0, and a 2x2 pool of an odd
# map (11x11 -> 5x5, the last row and column dropped).
TINY = Model("tiny-cnn", (1, 28, 28), 10, (
    Layer("c1", "conv2d", (4, 1, 3, 3), padding=1, relu=True, pool="max2x2"),    # 28x28 -> 28x28 -> 14x14
    Layer("c2", "conv2d", (8, 4, 4, 4), relu=True, pool="max2x2"),               # 14x14 -> 11x11 -> 5x5
    Layer("f1", "fc", (32, 200), relu=True),
    Layer("f2", "fc", (10, 32)),
))

ZO_METHODS = [("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2)]
# The runtimes checked step for step against torch on TINY, and the methods each trains.
AGAINST_TORCH = {"ort": ZO_METHODS, "cpp": PAPER_CONFIGS}
# TINY in INT8 on the binary against the reference: method, bp_layers, zo_loss
INT8_CONFIGS = [("full-bp", 0, "float"), ("full-zo", 0, "integer"), ("elastic-zo", 1, "float"),
                ("elastic-zo", 2, "integer")]


def command(runtime: str, request):
    return {"torch": lambda: TORCH_RUNNER, "ort": lambda: ORT_RUNNER,
            "cpp": lambda: request.getfixturevalue("native")}[runtime]()


def tiny_spec(method, k, runtime, data_dir, steps=40, **extra):
    s = job_spec(method, k, seed=5, steps=steps, runtime=runtime, model=TINY, data_dir=data_dir, **extra)
    if runtime == "ort":
        s["onnx_model"] = str(onnx_graph(TINY, method, k))
    return s


def test_tiny_shapes_follow_from_the_description():
    assert [s.pooled for s in TINY.shapes] == [(4, 14, 14), (8, 5, 5), (32,), (10,)]
    assert TINY.params_total == 40 + 520 + 6432 + 330
    assert layer_outputs(TINY) == [[3136, 3136, 784], [968, 968, 200], [32, 32], [10]]


@pytest.mark.parametrize("runtime,method,k", [(r, m, k) for r, ms in AGAINST_TORCH.items() for m, k in ms])
def test_a_model_defined_only_here_trains_alike_on_every_runtime(request, data_dir, tmp_path, runtime, method, k):
    t = run_runner(tiny_spec(method, k, "torch", data_dir), tmp_path / "torch")
    o = run_runner(tiny_spec(method, k, runtime, data_dir), tmp_path / runtime, command(runtime, request))
    assert_same_fp32_steps(t, o, 40)
    assert o["model"]["params_total"] == TINY.params_total
    if method != "full-bp":
        gt, go = (np.array([x["grad"] for x in r["trace"]]) for r in (t, o))
        assert np.corrcoef(gt, go)[0, 1] > 0.9999


def test_a_model_defined_only_here_learns_in_int8(data_dir, tmp_path):
    r = run_runner(tiny_spec("full-bp", 0, "torch", data_dir, steps=60, precision="int8"), tmp_path, check=True)
    losses = [x["loss"] for x in r["trace"]]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.3


@pytest.mark.parametrize("config", INT8_CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_a_model_defined_only_here_is_bit_exact_in_int8_on_the_binary(native, data_dir, tmp_path, config):
    s = tiny_spec(*config[:2], "torch", data_dir, steps=20, precision="int8", zo_loss=config[2])
    assert_same_int8_run(run_runner(s, tmp_path / "torch"), run_runner(s, tmp_path / "cpp", native))


# ---- PointNet at engine level ----

N_POINTS, BATCH = 32, 4
SMALL_POINTNET = POINTNET.with_points(N_POINTS)


def clouds(seed: int, batch: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (batch, N_POINTS, 3)).astype(np.float32),
            rng.integers(0, POINTNET.classes, batch))


def engine_spec(method, k, precision="fp32"):
    return JobSpec.from_dict(job_spec(method, k, seed=0, steps=1, model=POINTNET, dataset="modelnet40",
                                      threads=1, precision=precision, hyper={"points": N_POINTS}))


def clock():
    c = PhaseClock()
    c.start()
    return c


@pytest.mark.parametrize("method,k", ZO_METHODS)
def test_pointnet_front_on_ort_equals_torch(tmp_path, method, k):
    from workloads.ort_runner import OrtEngine
    from workloads.torch_runner import TorchEngine

    s = engine_spec(method, k)
    front = support.ort_front_layers(POINTNET, method, k)
    s.onnx_model = str(onnx_export.export(POINTNET, front, tmp_path))   # any number of points: dynamic
    init = POINTNET.init_weights(3)
    o, t = OrtEngine(s, SMALL_POINTNET, init), TorchEngine(s, SMALL_POINTNET, init)
    x, y = clouds(1)
    want = t.forward(t.load_batch(x, y)[0], keep=False).numpy()
    got = o.forward(o.load_batch(x, y)[0], keep=False)[0]
    assert got.shape == (BATCH, POINTNET.classes)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_pointnet_graph_has_dynamic_batch_and_points_and_is_deterministic(tmp_path):
    path = onnx_export.export(POINTNET, 7, tmp_path)
    assert onnx_export.export(SMALL_POINTNET, 7, tmp_path / "again").name == path.name   # N is not in the graph
    import onnx

    x = next(i for i in onnx.load(path).graph.input if i.name == "x")
    assert [d.dim_param or d.dim_value for d in x.type.tensor_type.shape.dim] == ["batch", "points", 3]


def pointnet_loss(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """PointNet written out by hand in float64: the reference the engine's description must match."""
    p = {name: flat[o:o + int(np.prod(s))].view(s) for name, o, s in POINTNET.offsets()}
    h = x
    for i in range(1, 6):
        h = torch.relu(h @ p[f"mlp{i}.weight"].T + p[f"mlp{i}.bias"])
    h = h.max(dim=1).values
    h = torch.relu(h @ p["fc1.weight"].T + p["fc1.bias"])
    h = torch.relu(h @ p["fc2.weight"].T + p["fc2.bias"])
    return torch.nn.functional.cross_entropy(h @ p["fc3.weight"].T + p["fc3.bias"], y)


@pytest.mark.parametrize("method,k", ZO_METHODS)
def test_pointnet_zo_estimate_equals_the_directional_derivative(method, k):
    from workloads.torch_runner import TorchEngine

    theta = POINTNET.init_weights(0).astype(np.float64)
    eng = TorchEngine(engine_spec(method, k), SMALL_POINTNET, theta)
    x, y = clouds(2)
    key = zrng.stream_key(0, zrng.STREAM_ZO, 5)
    r = methods.zo_step(eng, *eng.load_batch(x, y), key, eps=1e-7, clip=1e9, lr_zo=0.0, lr_bp=0.0, clock=clock())
    flat = torch.tensor(theta, requires_grad=True)
    pointnet_loss(flat, torch.from_numpy(x).double(), torch.from_numpy(y)).backward()
    directional = flat.grad.numpy()[:eng.n_zo] @ zrng.normal(key, 0, eng.n_zo).astype(np.float64)
    assert abs(directional) > 1e-3
    assert r["grad"] == pytest.approx(directional, rel=1e-5)


@pytest.mark.parametrize("method,k", [("full-bp", 0), ("elastic-zo", 2)])
def test_pointnet_int8_is_exact_and_learns_a_separable_toy_set(method, k):
    """Two classes: clouds stretched along x or along y. The integer network's activations stay
    integers in [-127, 127] and BP (in the head, or everywhere) brings the loss down."""
    eng = int8.Int8Engine(engine_spec(method, k, "int8"), SMALL_POINTNET)
    rng = np.random.default_rng(4)
    y = np.arange(16) % 2
    pts = rng.uniform(-1, 1, (16, N_POINTS, 3)).astype(np.float32) * np.float32(0.3)
    pts[np.arange(16), :, y] *= np.float32(3)
    x, yt = eng.load_batch(datasets.quantise_points(pts), y)
    q, _, saved = eng.forward(x, keep=True)
    for a, out in saved:
        assert torch.equal(out, out.round()) and out.abs().max() <= 127
    assert saved[0][0].min() < 0                 # the first pointwise layer's input is signed
    losses = []
    for t in range(30):
        if method == "full-bp":
            losses.append(methods.bp_step(eng, x, yt, 0, clock())["loss"])
        else:
            losses.append(methods.int8_zo_step(eng, x, yt, zrng.stream_key(0, zrng.STREAM_ZO, t), "float", 0,
                                               clock())["loss"])
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.2, losses


# ---- descriptions ----

@pytest.mark.parametrize("change,field", [
    (lambda d: d.pop("classes"), "classes: missing"),
    (lambda d: d["layers"][0].update(kind="conv"), "kind 'conv'"),
    (lambda d: d["layers"][1].update(weight_shape=[16, 5, 5, 5]), "layer 1 (conv2)"),
    (lambda d: d["layers"][2].update(pool="avg"), "pool 'avg'"),
    (lambda d: d["layers"][3].update(padding="1"), "layers[3].padding: expected int"),
    (lambda d: d["layers"][4].update(relu=True), "the last layer must be an fc layer without ReLU"),
    (lambda d: d["layers"][0].update(extra=1), "layers[0]: unknown keys ['extra']"),
    (lambda d: d.update(init="xavier"), "init 'xavier'"),
])
def test_a_malformed_description_names_its_field(change, field):
    d = LENET5.to_dict()
    change(d)
    with pytest.raises(ModelError) as e:
        Model.from_dict(d)
    assert field in str(e.value)


@pytest.mark.parametrize("model", [LENET5, POINTNET], ids=lambda m: m.name)
def test_the_init_bounds_each_layer_by_its_fan_in(model):
    """pytorch: weights and biases in 1/sqrt(fan_in); he (PointNet): weights in sqrt(6/fan_in)."""
    w = model.init_weights(3)
    gain = {"pytorch": 1.0, "he": np.sqrt(6.0)}[model.init]
    for l, (name, off, shape) in zip([l for l in model.layers for _ in (0, 1)], model.offsets()):
        bound = (gain if name.endswith(".weight") else 1.0) / np.sqrt(l.fan_in)
        part = np.abs(w[off:off + int(np.prod(shape))])
        assert part.max() <= bound * (1 + 1e-6) and part.max() > 0.8 * bound, name


def test_every_description_survives_its_dict():
    for m in (*MODELS.values(), TINY):
        assert models.from_dict(m.to_dict()) == m


# An MLP whose first layer has no ReLU: the BP head must follow `relu`, not "all but the last".
MLP = Model("mlp", (1, 28, 28), 10, (
    Layer("h1", "fc", (16, 784)),
    Layer("h2", "fc", (12, 16), relu=True),
    Layer("h3", "fc", (10, 12)),
))


@pytest.mark.parametrize("k", [2, 3])     # k=3: the whole network is the head; the graph only flattens
def test_numpy_head_follows_the_descriptions_relu(tmp_path, k):
    from workloads.ort_runner import OrtEngine
    from workloads.torch_runner import TorchEngine

    s = JobSpec.from_dict(job_spec("elastic-zo", k, seed=0, steps=1, model=MLP, threads=1))
    s.onnx_model = str(onnx_export.export(MLP, support.ort_front_layers(MLP, "elastic-zo", k), tmp_path))
    init = MLP.init_weights(1)
    o, t = OrtEngine(s, MLP, init), TorchEngine(s, MLP, init)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 8)
    for engine in (o, t):
        xb, yb = engine.load_batch(x, y)
        engine.loss(engine.forward(xb, keep=True), yb)
        engine.backward()
    want = torch.cat([p.grad.flatten() for p in t.bp_params]).numpy()
    np.testing.assert_allclose(o.grad, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
