"""The one vocabulary of zobench: method, precision, runtime, phase and status names.

Python runners, the harness, the store and the charts all import these names
from here (the C++ binary spells the same strings), so a phase can never be
called one thing in a result and another in a chart.
"""

METHODS = ("full-bp", "full-zo", "elastic-zo")
PRECISIONS = ("fp32", "int8", "bf16", "fp16")
# The half precisions: a transformer's weights, activations, gradients and MeZO's z in that
# dtype on torch (docs/transformers.md, "Half precision"); its loss, optimizer state and rates stay
# FP32. Bytes a value of each precision's tensors (the memory model's and the torch engine's).
HALF = ("bf16", "fp16")
VALUE_BYTES = {"fp32": 4, "int8": 1, "bf16": 2, "fp16": 2}
ZO_LOSSES = ("float", "integer")
# The ZO part of a method as parts (docs/zo-optimizers.md), each a hyperparameter; the first of
# each is MeZO's (and ElasticZO's) step. Its estimator of the projected gradient: two-point SPSA,
# (L(θ+εz) - L(θ-εz)) / 2ε, one-sided, (L(θ+εz) - L(θ)) / ε, or forward-grad, the exact ∇L·z of a
# Jacobian-vector product (torch only). Its update rule: SGD, θ -= lr g z; sign (ZO-SGD-Sign),
# θ -= lr sign(g) z; momentum (ZO-SGD-MMT); conservative (ZO-SGD-Cons: the best of θ and θ ∓ lr g z
# on the batch); adam (ZO-Adam, moments of g z). Its sparsity: every ZO parameter; a few of the ZO
# part's layers a step (LeZO); the smallest weights of each tensor (Sparse MeZO's mask); or a
# random mask (ZO-Bench's), drawn as ZO-Bench draws it (the share zeroed is Φ(1 − fraction), its
# quirk) or exactly (the fraction perturbed is zo_mask_fraction): ZO_MASK_DRAWS.
ZO_ESTIMATORS = ("two-point", "one-sided", "forward-grad")
ZO_UPDATES = ("sgd", "sign", "momentum", "conservative", "adam")
ZO_SPARSITIES = ("all", "layers", "magnitude", "random")
ZO_MASK_DRAWS = ("zo-bench", "exact")
# z's distribution: zobench-z's Irwin-Hall (n = 4) from its 32 bits, or a Gaussian from the same
# bits, a table of 65,536 N(0, 1) quantiles (docs/zrng.md); MeZO and ZO-Bench draw N(0, 1)
ZO_DISTRIBUTIONS = ("irwin-hall", "gaussian")
# the ZO sparsities that hold a mask, a byte per ZO parameter (the memory model's "zo" part)
ZO_MASKS = ("magnitude", "random")
# the values an update rule keeps per ZO-trained parameter (momentum's m; Adam's m and v); the
# others keep none (the C++ binary's zo_m and zo_v, the memory model's optimizer term)
ZO_UPDATE_STATE = {"momentum": 1, "adam": 2}
RUNTIMES = ("torch", "ort", "cpp")
DEVICES = ("cpu", "cuda")
# Untimed warm-up steps by device (hyper.warmup_steps = -1): a CPU needs its caches and thread
# pool warm; a GPU its context, kernels, cuDNN's algorithm choice and the CUDA graph's capture.
WARMUP_STEPS = {"cpu": 2, "cuda": 20}
# a job's final weights beside its result.json when its spec says save_weights (the C++ binary's
# common.hpp WEIGHTS_FILE): the bytes model.weights_sha256 hashes, which init_weights reads
WEIGHTS_FILE = "weights.bin"
STATUSES = ("ok", "failed", "timeout", "oom", "lost", "interrupted", "busy")
# The version of the result every runner (the C++ binary too: tests/test_cpp.py) writes, and the
# shape every reader sees: the store upgrades an older one once, on read (harness/stores/schema.py
# upgrade; docs/results.md, "Versions").
RESULT_SCHEMA = 2

# Training time is the sum of TRAIN_PHASES; eval is timed but reported apart.
# They map onto the ElasticZO paper's Alg. 1: zo_perturb = lines 5+7,
# forward = lines 6+8, zo_update = lines 10-11 (merged), backward/bp_update = line 12.
TRAIN_PHASES = ("data", "zo_perturb", "forward", "loss", "backward", "zo_update", "bp_update")
PHASES = TRAIN_PHASES + ("eval",)

# The paper's four configurations (method, bp_layers), in the order it introduces them.
PAPER_CONFIGS = (("full-bp", 0), ("full-zo", 0), ("elastic-zo", 1), ("elastic-zo", 2))

# elastic-zo's bp_layers -> the paper's name for the partition point.
PAPER_NAMES = {1: "ZO-Feat-Cls2", 2: "ZO-Feat-Cls1"}


def method_key(method: str, bp_layers: int) -> str:
    """Short stable key used in job ids, filters and chart legends."""
    return f"{method}-k{bp_layers}" if method == "elastic-zo" else method


def precision_key(precision: str, zo_loss: str, method: str) -> str:
    """The precision with the ZO loss it trains with (fp32, int8-float, int8-integer), used in
    job ids, compare keys and report labels; full-bp computes no ZO loss, so its INT8 is int8."""
    return f"{precision}-{zo_loss}" if precision == "int8" and method != "full-bp" else precision


def method_choice(method: str, bp_layers: int) -> str:
    """The method as a suite, a filter and the command line name it: elastic-zo:K (suites.MethodChoice)."""
    return f"{method}:{bp_layers}" if method == "elastic-zo" else method


# The paper's names of the precisions, in its order: INT8 with the integer-only ZO loss is INT8*,
# with the float one INT8 (a report's columns and legends).
PRECISION_LABELS = ("fp32", "int8", "int8*")


def precision_label(precision: str, zo_loss: str, method: str) -> str:
    key = precision_key(precision, zo_loss, method)
    return {"int8-float": "int8", "int8-integer": "int8*"}.get(key, key)


def method_label(method: str, bp_layers: int) -> str:
    """Human label that names the paper's configuration too."""
    if method == "elastic-zo":
        return f"ElasticZO k={bp_layers} ({PAPER_NAMES.get(bp_layers, 'custom')})"
    return {"full-bp": "Full BP", "full-zo": "Full ZO"}.get(method, method)

# How every runner's threads wait between parallel loops (a target's omp_wait_policy,
# docs/threads.md). "auto": spin while the machine is quiet, sleep at once while other work wants
# its cores -- the C++ binary's own team watches that as it runs (workloads/cpp/team.hpp), and the
# launcher picks for the Python runners' pools from the load just before they start
# (workloads/wait_policy.py). "passive" / "active" fix OMP_WAIT_POLICY for every runtime;
# "default" leaves each runtime's own.
OMP_WAIT_POLICIES = ("auto", "passive", "active", "default")
OMP_WAIT_POLICY = "auto"
# a target's `instructions`: whether its cpp jobs' instructions per step are counted after each
# timed job, and with what (harness/execution/instructions.py; docs/compare.md)
INSTRUCTION_COUNTERS = ("off", "callgrind")
