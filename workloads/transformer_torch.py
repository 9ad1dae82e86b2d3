"""The decoder-only transformer of models.Transformer on the torch engine's parameter views.

TorchEngine owns the parameters (one flat buffer, a view per tensor), the ZO perturbation and
the BP update; this is only what a transformer computes, unit by unit (embeddings, blocks,
head), and the loss of its task. Every operation of a pass that trains by BP is an explicit
torch op -- no nn.Module, no F.scaled_dot_product_attention -- so what autograd keeps for
backward is what the analytic memory model counts: the fused attention kernels keep no
[B, H, T, T] probabilities, this keeps one per block. A pass that keeps nothing (MeZO's,
ElasticZO's ZO front, evaluation) needs no probabilities at all: it runs the fused kernel (flash
attention on a GPU), which never holds the scores, and its activation functions in place.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

EPS = 1e-5              # LayerNorm's and RMSNorm's
ROPE_BASE = 10000.0


class TransformerNet:
    """models.Transformer's forward on named views. A unit is what ElasticZO partitions: 0 the
    embeddings, 1..depth the blocks, depth + 1 the head. A language model's output is the
    logits [B, T, vocab] of every position, a classifier's the class logits [B, classes] of the
    last position."""
    inputs = torch.long     # what load_batch makes of x: token ids

    def __init__(self, model, views, checkpointing: bool = False, loss_chunk: int = -1):
        """checkpointing: a block run with autograd recording (the BP part) keeps only its
        input and recomputes its activations during backward. loss_chunk: hyper.loss_chunk
        (models.Transformer.loss_chunk); a language model's output is then the final norm's
        [B, T, D], not the logits, and the loss and evaluate run the LM head a chunk of tokens
        at a time. -1 (the default here, the engine passes the job's): the logits whole."""
        self.model = model
        self.units = model.units
        self.p = {name: v for (name, _, _), v in zip(model.offsets(), views)}
        self.gpt2 = model.style == "gpt2"
        self.checkpointing = checkpointing
        self.loss_chunk = loss_chunk
        self.chunked = not model.classes and loss_chunk >= 0
        self.tables = {}    # per sequence length: the causal mask and llama's rotary cos and sin
        # a pass without autograd by the fused kernel and in place (above); False: as a BP pass,
        # what benchmarks/gpu_scale.py times it against
        self.fused = True

    def run(self, x, lo: int, hi: int):
        """Units lo..hi-1 on x: token ids [B, T] before unit 1, activations [B, T, D] between."""
        for u in range(lo, hi):
            if u == 0:
                x = self.embed(x)
            elif u <= self.model.depth:
                if self.checkpointing and torch.is_grad_enabled():
                    # no randomness to replay; stashing the RNG state would also break CUDA graph capture
                    x = checkpoint(self.block, x, u - 1, use_reentrant=False, preserve_rng_state=False)
                else:
                    x = self.block(x, u - 1)
            else:
                x = self.head(x)
        return x

    def loss(self, out, y):
        """The mean cross-entropy over every predicted token (or label), in FP32 whatever the
        weights' type: a half loss's rounding (bf16: 3 digits) would swamp MeZO's loss difference.
        Chunked (out the final norm's output): a forward-only pass sums the chunks' losses, one
        chunk's logits alive at a time; a pass that BP goes through (the output or the LM weight
        needs a gradient) runs ChunkedLoss, which keeps the norm's output and the weight and
        makes each chunk's logits again in backward, rather than keeping their log-softmax."""
        if not self.chunked:
            return F.cross_entropy(_fp32(out.flatten(0, -2)), y.flatten())
        h, y, w = out.flatten(0, -2), y.flatten(), self.lm_weight()
        chunk = self.model.loss_chunk(len(y), self.loss_chunk)
        if torch.is_grad_enabled() and (h.requires_grad or w.requires_grad):
            if not w.requires_grad:
                # ElasticZO's BP head reading the ZO-trained token embedding: backward runs after
                # the ZO update has moved it, so each kept pass keeps the embedding of its pass
                w = w.clone()
            return ChunkedLoss.apply(h, w, y, chunk)
        return _chunked_mean(h, w, y, chunk)

    def lm_weight(self):
        return self.p["wte"] if self.model.tied else self.p["lm_head.weight"]

    def evaluate(self, out, y) -> tuple[float, float]:
        """(the sum over samples of each one's mean token loss, the sum of each one's fraction of
        tokens predicted right): divided by the split's size, the mean loss and the token
        accuracy. A classifier's sample is one label, so these are its loss sum and correct count.
        Chunked, the logits are made a chunk of tokens at a time here too: a test batch is a
        training batch's size, and its whole logits would be the job's largest tensor."""
        if self.chunked:
            h, flat, w = out.flatten(0, -2), y.flatten(), self.lm_weight()
            chunk = self.model.loss_chunk(len(flat), self.loss_chunk)
            losses = torch.empty(len(flat), dtype=torch.float32 if h.dtype != torch.float64 else h.dtype,
                                 device=h.device)
            right = torch.empty(len(flat), dtype=torch.float64, device=h.device)
            for i, logits in _chunk_logits(h, w, chunk):
                losses[i:i + chunk] = F.cross_entropy(logits, flat[i:i + chunk], reduction="none")
                right[i:i + chunk] = logits.argmax(-1) == flat[i:i + chunk]
            losses, right = losses.view(len(y), -1), right.view(len(y), -1)
            return losses.mean(1).sum().item(), right.mean(1).sum().item()
        out, y = _fp32(out).view(len(y), -1, out.shape[-1]), y.view(len(y), -1)
        losses = F.cross_entropy(out.transpose(1, 2), y, reduction="none")
        right = (out.argmax(-1) == y).double()
        return losses.mean(1).sum().item(), right.mean(1).sum().item()

    def embed(self, tokens):
        x = self.p["wte"][tokens]
        return x + self.p["wpe"][:tokens.shape[1]] if self.gpt2 else x

    def block(self, x, i: int):
        b = f"h{i}"
        x = x + self.attention(self.norm(x, f"{b}.ln1"), b)
        return x + self.mlp(self.norm(x, f"{b}.ln2"), b)

    def head(self, x):
        if self.model.classes:
            # norms are per position, so only the last one is normalized; a copy of it, since
            # the norm keeps its input for backward, and a view would keep all of x
            return self.linear(self.norm(x[:, -1].contiguous(), "ln_f"), "cls")
        h = self.norm(x, "ln_f")
        if self.chunked:        # the LM head runs in the loss, a chunk at a time
            return h
        if not self.model.tied:
            return self.linear(h, "lm_head")
        w = self.p["wte"]
        if torch.is_grad_enabled() and not w.requires_grad:
            # ElasticZO's BP part reading the ZO-trained token embedding: backward runs after the
            # ZO update has moved it, so each kept pass keeps the embedding it was perturbed to
            w = w.clone()
        return F.linear(h, w)

    def attention(self, h, b: str):
        B, T, D = h.shape
        H, hd = self.model.heads, self.model.head_dim
        mask, rope = self.table(T, h)
        q, k, v = self.linear(h, f"{b}.attn.qkv").view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)
        if rope is not None:
            q, k = _rotate(q, *rope), _rotate(k, *rope)
        # one expression, so neither [B, H, T, T] nor [B, H, T, hd] temporary outlives the op
        # that reads it
        return self.linear(self.attend(q, k, v, mask).transpose(1, 2).reshape(B, T, D), f"{b}.attn.proj")

    def attend(self, q, k, v, mask):
        """Causal attention [B, H, T, hd]. With autograd, explicit: two score tensors at a time at
        most, and the probabilities, which autograd keeps, once it is done."""
        if self.fused and not torch.is_grad_enabled():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        hd = q.shape[-1]
        return torch.softmax((q @ k.transpose(-2, -1) * hd ** -0.5).masked_fill(mask, float("-inf")), -1) @ v

    def mlp(self, h, b: str):
        inplace = self.fused and not torch.is_grad_enabled()
        if self.gpt2:
            a = self.linear(h, f"{b}.mlp.fc")
            a = torch.ops.aten.gelu_(a, approximate="tanh") if inplace else F.gelu(a, approximate="tanh")
            return self.linear(a, f"{b}.mlp.proj")
        if inplace:
            return self.linear(F.silu(self.linear(h, f"{b}.mlp.gate"), inplace=True).mul_(self.linear(h, f"{b}.mlp.up")),
                               f"{b}.mlp.down")
        return self.linear(F.silu(self.linear(h, f"{b}.mlp.gate")) * self.linear(h, f"{b}.mlp.up"),
                           f"{b}.mlp.down")

    def norm(self, x, name: str):
        w = self.p[f"{name}.weight"]
        if self.gpt2:
            return F.layer_norm(x, (self.model.width,), w, self.p[f"{name}.bias"], EPS)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w

    def linear(self, x, name: str):
        return F.linear(x, self.p[f"{name}.weight"], self.p.get(f"{name}.bias"))

    def table(self, T: int, like):
        """The causal mask [T, T] (True above the diagonal: the future) and, for llama, the
        rotary cos and sin [T, head_dim], built once per length (a CUDA graph replays a step
        with those it was captured with). The angles are computed in float64 whatever the
        parameters' type."""
        if T not in self.tables:
            mask = torch.ones(T, T, dtype=torch.bool, device=like.device).triu(1)
            rope = None
            if not self.gpt2:
                hd = self.model.head_dim
                inv = ROPE_BASE ** -(torch.arange(0, hd, 2, dtype=torch.float64) / hd)
                angles = torch.outer(torch.arange(T, dtype=torch.float64), inv).repeat(1, 2)
                rope = tuple(f(angles).to(like.device, like.dtype) for f in (torch.cos, torch.sin))
            self.tables[T] = mask, rope
        return self.tables[T]


class ChunkedLoss(torch.autograd.Function):
    """The mean cross-entropy of the logits h wᵀ, a chunk of rows at a time, differentiable: it
    keeps h and w (the norm's output, which the LM head's linear kept before, and a weight), not
    the [n, V] log-softmax that F.cross_entropy keeps, and backward makes each chunk's logits again: its
    softmax less the one-hot target, times the incoming gradient over n, is the chunk's gradient
    of the logits, whose products with w and h are its rows of h's gradient and its share of w's.
    The recompute costs one more LM-head product a step; what it saves is the logits' O = n V
    values, times three at the loss's backward (the log-softmax, its gradient, the logits')."""

    @staticmethod
    def forward(ctx, h, w, y, chunk):
        ctx.save_for_backward(h, w, y)
        ctx.chunk = chunk
        return _chunked_mean(h, w, y, chunk)

    @staticmethod
    def backward(ctx, grad):
        h, w, y = ctx.saved_tensors
        chunk, n = ctx.chunk, len(y)
        dh = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        # a half weight's gradient is summed over the chunks in FP32, and rounded once
        dw = torch.zeros(w.shape, dtype=_fp32_type(w.dtype), device=w.device) if ctx.needs_input_grad[1] else None
        scale = grad / n
        for i, g in _chunk_logits(h, w, chunk):     # the chunk's logits again, then their gradient in place
            hc, yc = h[i:i + chunk], y[i:i + chunk]
            g.sub_(g.amax(-1, keepdim=True)).exp_()
            g.div_(g.sum(-1, keepdim=True))
            g.scatter_add_(1, yc[:, None], torch.full_like(yc[:, None], -1, dtype=g.dtype))
            g.mul_(scale)
            if dw is not None:
                dw.addmm_(g.t(), _fp32(hc))
            if dh is not None:
                torch.mm(g.to(w.dtype), w, out=dh[i:i + chunk])
            del g       # before a half weight's gradient is rounded beside its FP32 sum
        return dh, None if dw is None else dw.to(w.dtype), None, None


def _chunked_mean(h, w, y, chunk: int):
    """The mean cross-entropy of h wᵀ over the rows, summed a chunk at a time (FP32 logits)."""
    total = None
    for i, logits in _chunk_logits(h, w, chunk):
        part = F.cross_entropy(logits, y[i:i + chunk], reduction="sum")
        del logits      # before the next chunk's are made
        total = part if total is None else total + part
    return total / len(y)


def _chunk_logits(h, w, chunk: int):
    """(first row, FP32 logits) of each chunk of h's rows: one chunk's logits alive at a time.
    A half precision's on a GPU are made transposed, w h_cᵀ [V, c], and copied to FP32 [c, V]
    (as they always are, one copy): cuBLAS's fast kernels need rows of a multiple of 8 values,
    and [c, V] rows of GPT-2's 50,257 made the LM head an old architecture's kernel at a sixth of
    the GPU's speed, 40% of a MeZO step on an H200 (docs/transformers.md)."""
    transposed = h.is_cuda and h.dtype in (torch.bfloat16, torch.float16)
    for i in range(0, len(h), chunk):
        yield i, _logits(h[i:i + chunk], w, transposed)


def _logits(hc, w, transposed: bool):
    if transposed:
        return torch.empty(len(hc), len(w), dtype=torch.float32, device=hc.device).copy_(torch.mm(w, hc.t()).t())
    return _fp32(F.linear(hc, w))


def _fp32(x):
    """A half precision's logits in FP32 for the loss; FP32's and float64's (tests) as they are."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _fp32_type(dtype):
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _rotate(x, cos, sin):
    """Rotary embedding, rotate-half convention: the pairs are (x[j], x[j + head_dim/2])."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

