"""The decoder-only transformer of models.Transformer on the torch engine's parameter views.

TorchEngine owns the parameters (one flat buffer, a view per tensor), the ZO perturbation and
the BP update; this is only what a transformer computes, unit by unit (embeddings, blocks,
head), and the loss of its task. Every operation is an explicit torch op -- no nn.Module, no
F.scaled_dot_product_attention -- so what autograd keeps for backward is what the analytic
memory model counts: the fused attention kernels keep no [B, H, T, T] probabilities, this keeps
one per block.
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

    def __init__(self, model, views, checkpointing: bool = False):
        """checkpointing: a block run with autograd recording (the BP part) keeps only its
        input and recomputes its activations during backward."""
        self.model = model
        self.units = model.units
        self.p = {name: v for (name, _, _), v in zip(model.offsets(), views)}
        self.gpt2 = model.style == "gpt2"
        self.checkpointing = checkpointing
        self.tables = {}    # per sequence length: the causal mask and llama's rotary cos and sin

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
        weights' type: a half loss's rounding (bf16: 3 digits) would swamp MeZO's loss difference."""
        return F.cross_entropy(_fp32(out.flatten(0, -2)), y.flatten())

    def evaluate(self, out, y) -> tuple[float, float]:
        """(the sum over samples of each one's mean token loss, the sum of each one's fraction of
        tokens predicted right): divided by the split's size, the mean loss and the token
        accuracy. A classifier's sample is one label, so these are its loss sum and correct count."""
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
        # one expression, so no [B, H, T, T] temporary outlives the op that reads it: two at a
        # time at most, and the probabilities p, which autograd keeps, once it is done
        p = torch.softmax((q @ k.transpose(-2, -1) * hd ** -0.5).masked_fill(mask, float("-inf")), -1)
        return self.linear((p @ v).transpose(1, 2).reshape(B, T, D), f"{b}.attn.proj")

    def mlp(self, h, b: str):
        if self.gpt2:
            return self.linear(F.gelu(self.linear(h, f"{b}.mlp.fc"), approximate="tanh"), f"{b}.mlp.proj")
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


def _fp32(x):
    """A half precision's logits in FP32 for the loss; FP32's and float64's (tests) as they are."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _rotate(x, cos, sin):
    """Rotary embedding, rotate-half convention: the pairs are (x[j], x[j + head_dim/2])."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

