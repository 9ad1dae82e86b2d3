"""Analytic memory models: the ElasticZO paper's for layer models (Eqs. 2-5 FP32, 13-15 INT8),
and one built the same way for decoder-only transformers (FP32; docs/transformers.md).

Every tensor size comes from the model description in workloads/models.py, never from typed-in
numbers, so the model covers any architecture written there. As in the paper, every buffer is
assumed allocated for the whole run (no lifetime-based reuse): the parts add up to an upper
bound of the peak.

Layer models. Activations are the outputs of every operation: each layer's own (conv2d,
pointwise: one row per point, fc), its ReLU's and its pool's where the description has them
(LeNet-5: 18,058 values per sample; PointNet on 1,024 points: 2,753,352). The parts are as follows.

FP32 (4 bytes each):
- parameters: all weights and biases.
- activations: the activations, batch-sized.
- gradients: one per BP-trained parameter.
- errors: one per activation produced inside the BP part.
- optimizer: 2 per BP-trained parameter with Adam (Eq. 5). SGD, and the in-place ZO update,
  need none.

INT8 (NITI: int8 tensors plus the int32 buffers they are requantized from; no biases):
- parameters, activations, gradients and errors: as above, at 1 byte each.
- scratch (int32): each layer's output accumulator, batch-sized. For every
  BP-trained weight, its gradient accumulator. For every BP layer but the lowest, the
  accumulator of the error passed to its input.

This reproduces the paper's figures (Sec. 4's equations; checked in tests/test_memory_model.py). With
B=32 and B=256: Full ZO 2.6 / 18.0 MiB, Full BP 5.2 / 36.1 MiB, and ElasticZO adds
4.6 / 13.3 KiB (k=1) and 65.3 / 221.0 KiB (k=2). The INT8 ZO methods need 1.45-1.60x less
memory than FP32 (paper: 1.46-1.60), and INT8 ElasticZO adds 0.26 / 0.052% (k=1) and
4.1 / 1.4% (k=2) over INT8 Full ZO, as the paper's Sec. 5.2 states.

Transformers. The paper's parts assume a graph that keeps every output; PyTorch's autograd keeps
only what each op's backward reads, and a transformer's step also holds large tensors nobody
keeps (attention scores, logits and their gradients), so these parts count the tensors of
workloads/transformer_torch.py op by op (symbols in Sizes; 4 bytes a value):
- parameters: every weight once (a tied LM head is the token embedding).
- gradients: one per BP-trained parameter the task reads; a classifier never reads an untied
  LM head, which so gets no .grad.
- optimizer: Adam's 2 per BP-trained parameter, read or not: the engine allocates its moments
  over the whole BP part.
- activations: every tensor autograd keeps for backward (block_kept, head_kept), checked byte
  for byte against autograd's own record in tests/test_memory_model.py. ElasticZO keeps both
  perturbed passes' (methods.zo_step runs backward once, on their mean loss). With
  checkpointing each BP block keeps only its input.
- recompute: with checkpointing, the activations of the one block that backward re-makes at a
  time, less its input, already kept.
- working: the largest set of transient tensors alive at one moment of the step (moments), and
  the chunk of z values the ZO part is perturbed by at a time (zrng.CHUNK, or all of a smaller
  ZO part).
- inputs: the token batch as the engine holds it (int64 tokens and targets) and the tables
  every forward reads, built once per length: the causal mask, llama's rotary cos and sin.
The parts' total bounds a step's memory; peak_bytes predicts it: the parameters, optimizer and
inputs, there all along, plus the most the step holds at one of its moments (peak_moments),
each counting what is alive then -- activations not yet freed, gradients already made.

The ZO parts (docs/zo-optimizers.md; zo: the job's Hyper) add to both kinds, over the n ZO-trained
parameters: to "optimizer", momentum's m (n values) or Adam's m and v (2n); and a part of their
own, "zo", 0 for MeZO's step (zo_terms): the step's direction d (n values) where a rule with state
cannot fold it into the restore's pass (several queries, LeZO's ranges, weight decay); Sparse MeZO's mask (a
byte a ZO parameter); Forward-Grad's tangent (n values) and its dual values (a bound: twice a
layer model's activations, a dual value each and the jvp's products; a transformer's largest
transient set); and the BP head's
activations of every kept pass beyond MeZO's two (2q two-point, q + 1 one-sided). These are the
C++ binary's buffers (zo_m, zo_v, zo_d, zo_mask). torch and ort form d for momentum and Adam with
one query too (n values more), and ort draws each z into an n-value scratch (its docstring).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from workloads import gauss_table, vocab, zrng
from workloads.models import MODELS, Model, ModelError, Transformer

from harness.errors import UserError

PARTS = ("parameters", "activations", "gradients", "errors", "optimizer", "scratch", "zo")
TRANSFORMER_PARTS = ("parameters", "gradients", "optimizer", "activations", "recompute", "working", "inputs", "zo")
FLOAT, TOKEN = 4, 8         # bytes of an FP32 value and of an int64 token id


@dataclass
class Breakdown:
    method: str
    bp_layers: int
    precision: str
    batch: int
    optimizer: str
    parts: dict
    context: int | None = None          # transformers only: tokens a sequence
    checkpointing: bool | None = None   # transformers only
    # transformers only: the most the step holds at one moment (peak_moments), and the moment
    peak_bytes: int | None = None
    peak_at: str | None = None

    @property
    def total_bytes(self) -> int:
        """The parts summed as if each were at its largest at once: an upper bound (the paper's)."""
        return sum(self.parts.values())

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if v is not None}, "total_bytes": self.total_bytes}


def layer_outputs(model: Model) -> list[list[int]]:
    """Per layer, the sizes (per sample) of the activations it produces, in order: its output
    (conv2d [OC, H, W]; pointwise [N, O]; fc [O]), its ReLU's if it has one, its pool's if it
    has one (max2x2 [OC, H/2, W/2]; global-max [O])."""
    out = []
    for layer, shapes in zip(model.layers, model.shapes):
        o = math.prod(shapes.out)
        out.append([o] + [o] * layer.relu + [math.prod(shapes.pooled)] * bool(layer.pool))
    return out


def kept_passes(method: str, zo) -> int:
    """The forward passes whose BP-head activations a step keeps: MeZO's two for elastic-zo, or its
    estimator's (methods.zo_step); one for full-bp; none for full-zo."""
    if method != "elastic-zo":
        return int(method == "full-bp")
    if zo is None:
        return 2
    return {"two-point": 2 * zo.zo_queries, "one-sided": zo.zo_queries + 1, "forward-grad": 1}[zo.zo_estimator]


def zo_terms(method: str, n_zo: int, zo, dual: int, head_pass: int) -> tuple[int, int]:
    """(the ZO update rule's state, the "zo" part) in bytes, for n_zo ZO-trained parameters.
    dual: the values of one forward (Forward-Grad's dual values); head_pass: the values one kept
    pass of the BP head holds (a pass beyond MeZO's two adds them)."""
    if zo is None or method == "full-bp":
        return 0, 0
    state = vocab.ZO_UPDATE_STATE.get(zo.zo_update, 0)
    apart = bool(state) and (zo.zo_queries > 1 or zo.zo_sparsity == "layers" or zo.weight_decay > 0)
    part = FLOAT * n_zo * apart + n_zo * (zo.zo_sparsity in vocab.ZO_MASKS)
    part += FLOAT * gauss_table.SIZE * (zo.zo_distribution == "gaussian")      # Gaussian z's table
    if zo.zo_estimator == "forward-grad":
        part += FLOAT * (n_zo + dual)
    part += FLOAT * head_pass * max(kept_passes(method, zo) - 2, 0)
    return FLOAT * state * n_zo, part


def breakdown(model: Model | Transformer, method: str, batch: int, precision: str = "fp32", bp_layers: int = 0,
              optimizer: str = "sgd", context: int = 0, checkpointing: bool = False, zo=None,
              loss_chunk: int = 0) -> Breakdown:
    """The memory of one configuration; ValueError names what does not apply to the model.
    context: a transformer's tokens a sequence (0: its own context). zo: the job's hyperparameters
    (workloads.spec.Hyper), whose ZO parts add their terms (zo_terms); None: MeZO's step.
    loss_chunk: a language model's hyper.loss_chunk (models.Transformer.loss_chunk; -1: the
    logits whole)."""
    if zo is not None and precision != "fp32" and (parts := zo.zo_parts(method)):
        raise ValueError(f"the ZO parts ({parts}) are FP32's; INT8 trains its ZO part by Alg. 2 (docs/int8.md)")
    if model.kind == Transformer.kind:
        return _transformer(model, method, batch, precision, bp_layers, optimizer, context, checkpointing, zo,
                            loss_chunk)
    if context or checkpointing:
        raise ValueError(f"{'context' if context else 'checkpointing'}: only a transformer takes it; "
                         f"{model.name} is not one")
    first = model.first_bp_layer(method, bp_layers)
    outs = layer_outputs(model)
    weights = [math.prod(l.weight_shape) for l in model.layers]
    biases = [l.weight_shape[0] for l in model.layers]
    acts = batch * sum(sum(o) for o in outs)
    bp_acts = batch * sum(sum(o) for o in outs[first:])
    if precision == "fp32":
        params = [w + b for w, b in zip(weights, biases)]
        bp_params = sum(params[first:])
        # Forward-Grad's dual values: one per activation, and as many again for the products a
        # Jacobian-vector product forms on the way (x·dw and dx·w, then their sum: torch's)
        state, zo_part = zo_terms(method, sum(params[:first]), zo, 2 * acts, bp_acts)
        parts = {"parameters": 4 * sum(params), "activations": 4 * acts, "gradients": 4 * bp_params,
                 "errors": 4 * bp_acts, "optimizer": 4 * 2 * bp_params * (optimizer == "adam") + state,
                 "scratch": 0, "zo": zo_part}
    elif precision == "int8":
        bp_weights = sum(weights[first:])
        layer_acc = batch * sum(o[0] for o in outs)               # each layer's int32 output accumulator
        error_acc = batch * sum(math.prod(s.input) for s in model.shapes[first + 1:])
        parts = {"parameters": sum(weights), "activations": acts, "gradients": bp_weights, "errors": bp_acts,
                 "optimizer": 0, "scratch": 4 * (layer_acc + bp_weights + error_acc), "zo": 0}
    else:
        raise ValueError(f"precision {precision}: half precision trains the transformers; {model.name} trains in fp32 or int8")
    return Breakdown(method, bp_layers, precision, batch, optimizer, parts)


@dataclass(frozen=True)
class Sizes:
    """The symbols of the transformer model (docs/transformers.md): B sequences of T tokens, width
    D, H heads, MLP width F, vocabulary V, C classes (0: a language model)."""
    B: int
    T: int
    D: int
    H: int
    F: int
    V: int
    C: int
    llama: bool
    c: int = 0      # a language model's loss chunk, in tokens (0: the logits whole)

    @classmethod
    def of(cls, m: Transformer, batch: int, context: int, loss_chunk: int = -1) -> "Sizes":
        return cls(batch, context, m.width, m.heads, m.ffn, m.vocab, m.classes, m.style == "llama",
                   m.loss_chunk(batch * context, loss_chunk))

    @property
    def N(self) -> int:
        """Tokens in the batch: one row of every [B, T, .] activation."""
        return self.B * self.T

    @property
    def S(self) -> int:
        """Attention scores of one block, [B, H, T, T]: causal masking fills, never shrinks, them."""
        return self.B * self.H * self.T ** 2

    @property
    def read(self) -> int:
        """Positions the head reads: every one for next-token prediction, the last for a label."""
        return self.B if self.C else self.N

    @property
    def out(self) -> int:
        """O, the logits: [B, T, V], or the class logits [B, C]."""
        return self.read * (self.C or self.V)

    @property
    def held(self) -> int:
        """What a forward pass returns and the step holds a name on: O, or with the loss in chunks
        the final norm's output [B, T, D], from which the loss makes the logits."""
        return self.N * self.D if self.c else self.out

    @property
    def X(self) -> int:
        """One loss chunk's logits, [c, V] (0 unchunked)."""
        return self.c * self.V


def block_kept(z: Sizes, inner: bool) -> tuple[int, int]:
    """Values autograd keeps for one BP-trained block: (its input's, the rest). inner: the input
    needs a gradient, i.e. the unit before is BP-trained too.

    gpt2, 8 N D + 2 N F + S + 4 N: each LayerNorm keeps its input, mean and rstd (the block input
    x and x2 = x + attention: 2 N D + 4 N); each linear its input (ln1's and ln2's outputs, the
    merged heads: 3 N D; GELU's output: N F); q k^T and p v keep their operands, copies matmul
    makes of qkv's strided head views for q, k and v (3 N D), and p, softmax's output, which
    softmax keeps anyway (S); GELU its input (N F). The masked fill keeps only the causal mask,
    shared (inputs).
    llama, 10 N D + 4 N F + S + 2 N when inner: RMSNorm, x * rsqrt(mean(x^2) + eps) * w, keeps x
    and the rsqrt (N D + N) only when x needs a gradient (pow and the first product keep them for
    it), x * rsqrt always (the product with w keeps it for w's): for x and x2, the latter always
    needing a gradient. The linears as gpt2's, but the MLP's down reads SwiGLU's product (3 N D
    + N F). RoPE keeps only cos and sin, shared (inputs), so q k^T keeps the rotated q and k as
    they are, contiguous, and p v copies v (3 N D), and p (S). SwiGLU keeps the gate's output for
    silu, silu's output and up's for their product (3 N F)."""
    N, D, S, F = z.N, z.D, z.S, z.F
    if not z.llama:
        return N * D, 7 * N * D + 2 * N * F + S + 4 * N
    return N * D * inner, 9 * N * D + 4 * N * F + S + N * (1 + inner)


def attention_kept(z: Sizes, inner: bool) -> int:
    """Of block_kept's rest, what the attention's backward still needs once the MLP's, ln2's and
    the output projection's have run, p aside: gpt2, ln1's mean and rstd, its output, the q and k
    copies (3 N D + 2 N); llama, ln1's x * rsqrt (and its rsqrt when the input needs a gradient),
    its output, the rotated q and k (4 N D + N)."""
    N, D = z.N, z.D
    return 4 * N * D + N * inner if z.llama else 3 * N * D + 2 * N


def head_kept(z: Sizes, inner: bool, weight_trains: bool) -> int:
    """Values autograd keeps for the BP-trained head, on the n positions it reads (Sizes.read; a
    classifier's last one is a copy, so that nothing keeps all of x): the final norm's, as in a
    block; the output linear's input h (n D) when its weight trains, and otherwise, a tied LM
    head under ElasticZO (the embedding ZO-trained), the copy of the embedding the engine
    multiplies by, so that backward, run after the ZO update has moved the embedding, sees the
    weights of its pass (V D); the loss's log-softmax output (O) and the total weight its mean
    divides by (1). With the loss in chunks (transformer_torch.ChunkedLoss) the loss keeps the
    norm's output h (n D) and the weight it multiplies by (the copy, V D, where the embedding is
    ZO-trained) and no log-softmax: backward makes each chunk's logits again."""
    n, D = z.read, z.D
    norm = head_norm(z, inner)
    if z.c:
        return norm + n * D + (0 if weight_trains else z.V * D)
    return norm + (n * D if weight_trains else z.V * D) + z.out + 1


def head_norm(z: Sizes, inner: bool) -> int:
    """Values the BP-trained head's final norm keeps, as a block's (block_kept)."""
    n, D = z.read, z.D
    return n * D + 2 * n if not z.llama else (n * D + n) * inner + n * D


def moments(z: Sizes, zo_blocks: bool, zo_head: bool, bp_blocks: bool, bp_head: bool,
            fused: bool = True) -> dict[str, int]:
    """Transient values (neither kept for backward nor gradients) at the moments of a step that
    can hold the most, by moment. Each counts the output a step holds (Sizes.held: O, or with the
    loss in chunks the final norm's N D): bp_step's through backward, zo_step's first pass's
    through the second forward -- where that pass was kept for backward and the loss is chunked,
    its output is an activation already, and a ZO moment adds none.
    - zo-attention, a block run without autograd: the fused kernel (F.scaled_dot_product_attention)
      holds no scores, so its largest moment is its output's head-merging copy, or the output
      projection, beside the block input (run holds it), ln1's output, qkv (v is a view of it)
      and llama's rotated q and k: O + 7 N D (llama 9 N D).
    - zo-mlp: O + 4 N D + N F (llama 3 N D + 2 N F), the activations in place: gpt2's at the
      output projection, x, x2, ln2's output, the fc output GELU overwrote, the projection;
      llama's as up's output is multiplied into silu's (in place over the gate's).
    - zo-head: 2 O + 2 N D: its output beside the previous pass's, x and its norm. In chunks:
      the norm's output and one chunk's logits and log-softmax, N D + 2 X.
    - bp-attention, a BP block's forward (or its recompute) at its scores: O + 2 S + 3 N D: the
      score tensors an op reads and writes before p, and qkv; the rest is kept for backward.
    - bp-mlp, backward through the MLP: O + 2 N F (llama 3 N F): gpt2's gradients of GELU's
      output and input, llama's of the product, of silu's output and of up's.
    - bp-head, backward through the loss: 3 O: the gradients of the log-softmax and of O. In
      chunks: the gradient of the norm's output (N D), one chunk's logits made again and turned
      into their gradient in place (X), and c for a row-wise max or sum.
    - bp-loss, in chunks only: a chunk's logits and their log-softmax as the kept pass's loss is
      summed (2 X).
    These moments hold kept activations and gradients too, counted in those parts.
    fused=False: a ZO block as a BP pass runs it (Forward-Grad's jvp records, so it runs the
    explicit attention): zo-attention O + 2 S + 5 N D (llama 7 N D), the score tensors an op
    reads and writes beside the block input, ln1's output, qkv and llama's rotated q and k;
    zo-mlp O + 3 N D + 2 N F (llama 3 N F), GELU's input and output, or llama's silu output,
    up's and their product."""
    N, D, S, F, O = z.N, z.D, z.S, z.F, z.out
    held = z.held if zo_head or not z.c else 0
    found = {}
    if zo_blocks:
        if fused:
            found["zo-attention"] = held + (7 + 2 * z.llama) * N * D
            found["zo-mlp"] = held + (3 if z.llama else 4) * N * D + (1 + z.llama) * N * F
        else:
            found["zo-attention"] = held + 2 * S + (5 + 2 * z.llama) * N * D
            found["zo-mlp"] = held + 3 * N * D + (2 + z.llama) * N * F
    if zo_head:
        found["zo-head"] = z.held + 2 * z.X if z.c else 2 * O + 2 * N * D
    if bp_blocks:
        found["bp-attention"] = z.held + 2 * S + 3 * N * D
        found["bp-mlp"] = z.held + (2 + z.llama) * N * F
    if bp_head:
        found["bp-head"] = N * D + z.X + z.c if z.c else 3 * O
        if z.c:
            found["bp-loss"] = 2 * z.X
    return found


def peak_moments(m: Transformer, z: Sizes, first: int, passes: int, activations: int, head: int,
                 first_block: int, zo: dict[str, int], chunk: int, optimizer: str,
                 checkpointing: bool = False) -> dict[str, int]:
    """Values alive, besides the parameters, optimizer state and inputs, at each moment of a step
    that can hold its most (the engine's order: methods.bp_step, zo_step; torch's autograd frees
    a saved tensor once its node has run, and makes a parameter's gradient when it reaches it).
    activations: the activations part; head: the values the head keeps a pass; first_block: the
    values the first BP block keeps (its input's included), or 0 without BP blocks; zo: the ZO
    moments (moments()); chunk: the z values perturbed at a time. O below is the output the step
    holds (Sizes.held); with the loss in chunks a kept pass's is one of its activations.
    - zo-pass: a ZO forward's largest moment; ElasticZO's second pass also holds the first's
      kept activations.
    - bp-forward: a BP block's forward at its scores (bp-attention less O, which no pass has
      made yet), every activation but the head's kept, and the first pass's O under ElasticZO.
    - loss-backward: the loss's backward, every activation still kept and no gradient made:
      bp-head's 3 O. The measured peak of a language model's Full BP and ElasticZO step. In
      chunks: bp-head's N D + X + c, and the LM weight's gradient (V D) where it trains, summed
      over the chunks from the first.
    - loss-forward (in chunks): every activation and a chunk's logits and log-softmax (2 X).
    - block-backward: the first BP block's MLP backward, the last block backward reaches: O,
      every gradient made but the block's own (its MLP output projection's made) and the
      embeddings', the block's kept values (with checkpointing, recomputed), the gradient
      flowing in (N D), and the MLP's gradients beyond the tensors they replace (gpt2 N F,
      llama 2 N F).
    - top-block-backward: as block-backward, for the last block, the first backward reaches
      after the head: every activation but the pass's head still kept, the head's gradients (and
      a tied LM head's), the block's MLP output projection's. Below loss-backward while the loss
      keeps O; the peak of a chunked language model's BP step, or of a classifier's.
    - embedding-backward (Full BP): every gradient, O, the embedding output's gradient N D, and
      the dense [V, D] gradient the embedding's backward makes with new_zeros and then
      index_put, out of place: twice V D, of which a tied embedding's already made .grad is one
      (it receives the LM head's) and an untied one's is the result.
    - pass-gradients (ElasticZO): the two passes' gradients of a BP tensor meet in autograd's
      input buffer, which adds them out of place: for the largest, both and their sum, beside
      O and the other gradients.
    - zo-update: the perturbation's chunk of z (chunk values), as the last perturbation
      (restore and update) runs: O and, under ElasticZO, both passes' activations are alive.
    - adam-update: Adam's three temporaries the size of the largest BP tensor (methods.
      adam_update's expressions), beside O and every gradient."""
    N, D, F, O, V = z.N, z.D, z.F, z.held, z.V
    kept_out = 0 if z.c else O          # a kept pass's output beyond its activations
    trained = [t for t in m.tensors() if t.unit >= first and not (m.classes and t.name == "lm_head.weight")]
    grads = sum(t.size for t in trained)
    found = {}
    if zo:
        found["zo-pass"] = activations * (passes - 1) // passes + max(zo.values())
    if first_block:
        # the last BP block's forward at its softmax: its attention's kept values so far, qkv,
        # the scores and p, beside every activation of the blocks below (and of the first pass)
        inner = m.depth > first
        found["bp-forward"] = activations - head - block_kept(z, inner)[1] + attention_kept(z, inner) + \
            kept_out * (passes - 1) + 2 * z.S + 3 * N * D
        u = max(first, 1)
        made = sum(t.size for t in trained if t.unit > u or (t.unit == u and t.name.startswith(
            (f"h{u - 1}.mlp.proj", f"h{u - 1}.mlp.down"))) or (t.name == "wte" and m.tied and not m.classes))
        found["block-backward"] = O + made + first_block + N * D + (1 + z.llama) * N * F
        # the same for the last block, the first backward reaches: every activation but the
        # pass's head (the block's own recomputed beside its input with checkpointing), the
        # gradients of the head and the tied LM head, and its MLP output projection's
        top = m.depth
        made = sum(t.size for t in trained if t.unit > top or t.name.startswith((f"h{top - 1}.mlp.proj", f"h{top - 1}.mlp.down"))
                   or (t.name == "wte" and m.tied and not m.classes))
        rest = first_block - N * D if checkpointing else 0
        found["top-block-backward"] = O + made + activations - head + rest + N * D + (1 + z.llama) * N * F
        # the attention's backward, at its softmax's: what the block's attention still keeps
        # (attention_kept) and p, and beside them p's gradient and the scores' (2 S), v's
        # gradient and the gradient flowing in (2 N D); for the first BP block (the last
        # reached: the blocks above it freed) and for the last (the first reached: every
        # activation below it still kept); with checkpointing, the block recomputed, beside its input
        for name, unit, alive in (("attention-backward", u, None), ("top-attention-backward", top, activations - head)):
            inner = unit > first
            made = sum(t.size for t in trained if t.unit > unit or (t.unit == unit and not t.name.startswith(
                (f"h{unit - 1}.ln1", f"h{unit - 1}.attn.qkv"))) or (t.name == "wte" and m.tied and not m.classes))
            if alive is None:
                alive = N * D if checkpointing else block_kept(z, inner)[0]
            elif not checkpointing:
                alive -= block_kept(z, inner)[1]
            found[name] = O + made + alive + attention_kept(z, inner) + 3 * z.S + 2 * N * D
    if head:
        found["loss-backward"] = activations + (N * D + z.X + z.c + lm_grad(m, z, first) if z.c else 3 * O)
        if z.c:
            found["loss-forward"] = activations + 2 * z.X
    if first == 0:
        found["embedding-backward"] = grads + O + N * D + V * D * (1 + (m.tied and not m.classes))
    biggest = max(trained, key=lambda t: t.size, default=None)
    largest = biggest.size if biggest else 0
    if passes == 2 and trained:
        # in chunks, the LM head's two gradients meet once both passes' losses have run backward,
        # before either pass's final norm: both norms' kept values are still there
        norms = passes * head_norm(z, first <= m.depth) if z.c and biggest.name == "lm_head.weight" else 0
        found["pass-gradients"] = O + grads + 2 * largest + norms
    if chunk:
        found["zo-update"] = activations + (O if not activations else kept_out) + chunk
    if optimizer == "adam" and trained:
        found["adam-update"] = grads + O + 3 * largest
    return found


def lm_grad(m: Transformer, z: Sizes, first: int) -> int:
    """The LM weight's gradient the chunked loss sums (V D), where that weight trains: an untied
    LM head in the BP part, or a tied one under Full BP; 0 where it is the ZO-trained embedding."""
    return z.V * z.D * (not m.classes and (not m.tied or first == 0) and first <= m.depth + 1)


def _transformer(m: Transformer, method: str, batch: int, precision: str, bp_layers: int, optimizer: str,
                 context: int, checkpointing: bool, zo=None, loss_chunk: int = 0) -> Breakdown:
    if precision == "int8":
        raise ValueError("precision int8: transformers train in fp32, bf16 or fp16")
    E = vocab.VALUE_BYTES[precision]        # a weight's, an activation's and a gradient's bytes
    T = context or m.context
    if m.style == "gpt2" and T > m.context:
        raise ValueError(f"context {T}: {m.name} has {m.context} learned positions")
    if checkpointing and method == "full-zo":
        raise ValueError("checkpointing: full-zo keeps no activations to checkpoint")
    z = Sizes.of(m, batch, T, loss_chunk)
    first = m.first_bp_layer(method, bp_layers)         # first BP unit: 0 embeddings, 1..L blocks, L + 1 head
    blocks = range(max(first, 1), m.depth + 1)          # the BP blocks' units; unit u is block u - 1
    kept = [block_kept(z, u > first) for u in blocks]
    # the output linear's weight trains unless it is the token embedding, ZO-trained
    head = head_kept(z, first <= m.depth, bool(m.classes) or not m.tied or first == 0) if method != "full-zo" else 0
    passes = 2 if method == "elastic-zo" else 1         # zo_step keeps both perturbed passes for backward
    # (more passes, the ZO parts': in parts["zo"], zo_terms)
    if checkpointing:
        activations = passes * (len(blocks) * z.N * z.D + head)
        recompute = max((rest for _, rest in kept), default=0)
    else:
        activations = passes * (sum(map(sum, kept)) + head)
        recompute = 0
    trained = [t for t in m.tensors() if t.unit >= first]
    read = sum(t.size for t in trained if not (m.classes and t.name == "lm_head.weight"))
    bp = sum(t.size for t in trained)
    found = moments(z, first > 1, method == "full-zo", len(blocks) > 0, method != "full-zo")
    if precision in vocab.HALF and method == "full-zo" and not z.c:
        # a ZO pass's loss: the output, its FP32 copy and that copy's log-softmax
        # (FP32's own .float() is the output itself: zo-head holds as much)
        found["zo-loss"] = 3 * z.out
    half = precision in vocab.HALF
    # the values of each moment that are FP32 in every precision: the loss's (bp-head's gradients
    # of the log-softmax and of the FP32 copy; zo-loss's copy and log-softmax; a chunk's logits
    # and log-softmax, and in half precision its logits as the LM head makes them beside their
    # FP32 copy in backward, which the row-wise c never outweighs)
    fp32_found = {"bp-head": 2 * z.out, "zo-loss": 2 * z.out} if not z.c else \
        {"zo-head": 2 * z.X, "bp-loss": 2 * z.X, "bp-head": z.X + z.c}
    if z.c and half and "bp-head" in found:
        found["bp-head"] += z.X - z.c       # the half logits beside their FP32 copy, for c
        fp32_found["bp-head"] = z.X
    peak = max(E * v + (FLOAT - E) * fp32_found.get(n, 0) for n, v in found.items())
    chunk = min(zrng.CHUNK, m.params_total - bp)
    tables = z.T ** 2 + (2 * z.T * m.head_dim * FLOAT if z.llama else 0)       # bool mask; cos, sin
    # Forward-Grad: a dual value beside each value of the largest transient set, and as many for
    # the jvp's products (its rule for a layer model's activations too)
    explicit = max(moments(z, first > 1, method == "full-zo", False, False, fused=False).values(), default=0)
    state, zo_part = zo_terms(method, m.params_total - bp, zo, 2 * max(peak // E, explicit), activations // passes)
    # the loss is FP32 in every precision (transformer_torch.loss): what it keeps a pass, its
    # log-softmax's output and total weight, is 4 bytes a value in half precision too; in
    # chunks it keeps nothing of its own
    loss = passes * (z.out + 1) * (method != "full-zo") * (not z.c)
    # Adam's moments are FP32 (the torch engine's state_dtype)
    parts = {"parameters": E * m.params_total, "gradients": E * read,
             "optimizer": 2 * FLOAT * bp * (optimizer == "adam") + state,
             "activations": E * (activations - loss) + FLOAT * loss, "recompute": E * recompute,
             "working": peak + half_chunk(precision, chunk),
             "inputs": TOKEN * (z.N + (z.B if z.C else z.N)) + tables, "zo": zo_part}
    zo = {k: v for k, v in found.items() if k.startswith("zo-")}
    first_block = (z.N * z.D + recompute if checkpointing else sum(kept[0])) if kept else 0
    at = peak_moments(m, z, first, passes, activations, head, first_block, zo, chunk, optimizer, checkpointing)
    # in bytes: E a value, but for the values of the loss's, FP32 in every precision (the kept
    # ones of each pass alive, and the loss's transients), and the perturbation's z chunk
    top = max(zo, key=zo.get, default="")
    fp32 = {"loss-backward": loss + 2 * z.out, "zo-update": loss, "loss-forward": 2 * z.X,
            "zo-pass": loss * (passes - 1) // passes + 2 * z.out * (top == "zo-loss") + 2 * z.X * (top == "zo-head")}
    if precision in vocab.HALF and trained:
        # Adam's update reads FP32 moments: its three temporaries are FP32, and so is the copy of
        # the gradient it reads (torch engine's bp_update)
        largest = max(t.size for t in trained)
        fp32["adam-update"] = 3 * largest + FLOAT // (FLOAT - E) * largest
    at = {n: E * v + (FLOAT - E) * fp32.get(n, 0) + (half_chunk(precision, chunk) - E * chunk) * (n == "zo-update")
          for n, v in at.items()}
    if "loss-backward" in at and z.c:
        # the chunked loss's backward: the LM weight's gradient summed in FP32 (ChunkedLoss), then
        # in half precision rounded to the weights' type beside it at the end; a chunk's logits
        # FP32, beside the half ones the head makes (bp-head)
        # at ElasticZO's second loss backward the first pass's head is freed and its LM weight
        # gradient waits in autograd's input buffer
        dw = lm_grad(m, z, first)
        at["loss-backward"] = E * (activations + z.N * z.D) + FLOAT * dw + \
            (max((E + FLOAT) * z.X, E * dw) if half else FLOAT * (z.X + z.c)) + (passes - 1) * max(0, E * (dw - head))
    name = max(at, key=at.get)
    resident = parts["parameters"] + parts["optimizer"] + parts["inputs"] + parts["zo"]     # zo: an upper bound
    return Breakdown(method, bp_layers, precision, batch, optimizer, parts, T, checkpointing, resident + at[name],
                     name)


def half_chunk(precision: str, chunk: int) -> int:
    """The bytes of the z chunk a perturbation adds at a time: FP32 z, and in half precision also
    its rounded copy and that copy in FP32 (zrng_torch.as_added)."""
    return FLOAT * chunk + (vocab.VALUE_BYTES[precision] + FLOAT) * chunk * (precision in vocab.HALF)


def asked(model_name: str, batch: int, precision: str, method: str | None, bp_layers: int | None,
          optimizer: str, points: int | None, context: int, checkpointing: bool, zo=None,
          loss_chunk: int = 0) -> list[Breakdown]:
    """`zobench memory`'s breakdowns: the method asked for, or the paper's four (checkpointing then
    applies to those with a BP part to checkpoint); a UserError names the option that cannot be."""
    if loss_chunk and MODELS[model_name].kind != Transformer.kind:
        raise UserError(f"memory --loss-chunk: only a transformer takes it; {model_name} is not one")
    if bp_layers is not None and method != "elastic-zo":
        raise UserError("memory --bp-layers: only with --method elastic-zo")
    model = MODELS[model_name]
    if points is not None:
        if model.kind == Transformer.kind:
            raise UserError(f"memory --points: {model.name} is a transformer; it takes --context")
        try:
            model = model.with_points(points)
        except ModelError as e:
            raise UserError(f"memory --points: {e}") from None
    configs = [(method, bp_layers or (1 if method == "elastic-zo" else 0))] if method else list(vocab.PAPER_CONFIGS)
    try:
        return [breakdown(model, m, batch, precision, k, optimizer, context,
                          checkpointing and (m != "full-zo" or method is not None), zo, loss_chunk)
                for m, k in configs]
    except ValueError as e:
        raise UserError(f"memory: {e}") from None


def human(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def label(r: Breakdown) -> str:
    """The paper's names for a layer model's configurations; a transformer's method key, since
    its units are not the paper's classifier layers, and whether it checkpoints."""
    if r.context is None:
        return vocab.method_label(r.method, r.bp_layers)
    return vocab.method_key(r.method, r.bp_layers) + (" +ckpt" if r.checkpointing else "")


def table(rows: list[Breakdown]) -> str:
    """One line per breakdown, a column per part of its kind (transformers': TRANSFORMER_PARTS,
    their context, and the predicted peak beside the total that bounds it)."""
    ctx = any(r.context is not None for r in rows)
    parts = [p for p in dict.fromkeys(TRANSFORMER_PARTS + PARTS if ctx else PARTS + TRANSFORMER_PARTS)
             if any(p in r.parts for r in rows) and (p != "zo" or any(r.parts["zo"] for r in rows))]
    head = f"{'method':34} {'prec':5} {'batch':>5} " + (f"{'ctx':>6} " if ctx else "") + \
        " ".join(f"{p:>12}" for p in parts) + f" {'total':>12}" + (f" {'peak':>12}" if ctx else "")
    lines = [head]
    for r in rows:
        peak = f" {human(r.peak_bytes) if r.peak_bytes is not None else '':>12}" if ctx else ""
        lines.append(f"{label(r):34} {r.precision:5} {r.batch:5d} " + (f"{r.context or '':>6} " if ctx else "") +
                     " ".join(f"{human(r.parts.get(p, 0)):>12}" for p in parts) + f" {human(r.total_bytes):>12}" +
                     peak)
    return "\n".join(lines)
