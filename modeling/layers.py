"""Transformer building blocks on flat token streams (Vaswani et al. 2017, as used by HIBERT §3.1–3.2).

Every layer takes `x [N, H]`: the stored elements of G variable-length sequences, back to back. Token-wise
work (linears, FFN, LayerNorm) runs on those N rows only. Attention alone needs the sequences side by side:
on CUDA it runs the memory-efficient (cutlass) attention kernel in its variable-length mode straight on
the stream (cumulative lengths, no padding at all); elsewhere it scatters q/k/v into a zero-filled [G, L]
grid (`Layout`), runs torch's fused scaled_dot_product_attention with a key-padding mask (or causally), and
gathers the N rows back. Many sequences of mixed lengths (a batch of documents' sentences) go to a few
grids by length instead of one as wide as the longest (`Layout.buckets`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from hibert.config.model import ModelConfig

# Variable-length attention on CUDA. HIBERT's sequences are short (median sentence ~25 tokens), where the
# cutlass kernel's 64x64 tiles waste far less than flash attention's 128x128 ones: on an H100, forward +
# backward of one HIBERT_M sentence layer over 60k tokens took 1.6 ms against 4.2 ms for varlen flash
# attention and 5.7 ms for padded SDPA. The op is differentiable and traceable by torch.compile.
_VARLEN_ATTENTION = getattr(torch.ops.aten, "_efficient_attention_forward", None)

# On the padded path, skip cuDNN attention: it builds an execution plan for every new shape, which costs
# milliseconds of host time on every ragged batch.
_CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sinusoidal_table(num_positions: int, dim: int) -> Tensor:
    """Sine-cosine position embeddings (Vaswani et al. 2017 §3.5); HIBERT §3.1 uses one table for
    word positions and sentence positions."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table.float()


@dataclass(frozen=True)
class Layout:
    """How a flat stream of N elements maps onto a [num_seqs, max_len] grid for attention."""

    num_seqs: int
    max_len: int
    index: Tensor | None = None     # [N] flat grid slot of each element; None = the stream is the whole grid
    key_mask: Tensor | None = None  # [num_seqs, max_len] bool, True = real key; None = nothing to hide
    causal: bool = False            # decoder: position i sees keys <= i (right padding then needs no mask)
    cu_seqlens: Tensor | None = None  # [num_seqs + 1] int32 sequence starts in the stream (packed only)

    @cached_property
    def buckets(self) -> "list[Bucket] | None":
        """The padded path's grids by sequence length, or None for the one [num_seqs, max_len] grid.

        One grid as wide as the longest sequence wastes most of its work on mixed lengths: 16 CNN/DM
        documents hold 513 sentences of 2-49 tokens, 44% of a 56-wide grid is padding, attention's cost
        grows with the square of the width, and the grid (88 MB of q/k/v) is zero-filled at every layer.
        Sequences are grouped by their length rounded up to 8, groups of fewer than `_MIN_BUCKET`
        sequences joining the next wider one (a few small grids cost more in per-call overhead than their
        padding): 29 against 15 ms per layer for those 16 documents on 2 CPU cores, H=256; a single
        document's 35 sentences stay one grid. Computed once per layout (the layers share it)."""
        if self.cu_seqlens is None or self.num_seqs < 2 * _MIN_BUCKET:
            return None
        cu = self.cu_seqlens.long().cpu()
        lengths = cu[1:] - cu[:-1]
        width = (lengths + 7) // 8 * 8
        groups: list[list[int]] = []
        for w in sorted(set(width.tolist()) - {0}):
            members = torch.nonzero(width == w).squeeze(1).tolist()
            if groups and len(groups[-1]) < _MIN_BUCKET:
                groups[-1].extend(members)
            else:
                groups.append(members)
        if len(groups) > 1 and len(groups[-1]) < _MIN_BUCKET:
            groups[-2].extend(groups.pop())
        if len(groups) < 2:
            return None
        device = self.cu_seqlens.device
        out = []
        for members in groups:
            seqs = torch.tensor(members)
            lens, starts = lengths[seqs], cu[seqs]
            w = int(width[seqs].max())
            offset = torch.arange(int(lens.sum())) - torch.repeat_interleave(lens.cumsum(0) - lens, lens)
            out.append(Bucket(
                num_seqs=len(members), max_len=w,
                src=(torch.repeat_interleave(starts, lens) + offset).to(device),
                slot=(torch.repeat_interleave(torch.arange(len(members)) * w, lens) + offset).to(device),
                key_mask=(torch.arange(w)[None] < lens[:, None]).to(device),
            ))
        return out


_MIN_BUCKET = 64  # fewest sequences a length bucket of the padded path holds


@dataclass(frozen=True)
class Bucket:
    """Sequences of similar length on their own [num_seqs, max_len] grid."""

    num_seqs: int
    max_len: int
    src: Tensor       # [n] stream position of each of the bucket's elements
    slot: Tensor      # [n] their slots on the bucket's grid
    key_mask: Tensor  # [num_seqs, max_len] bool


def attention(qkv: Tensor, layout: Layout, heads: int) -> Tensor:
    """Multi-head self-attention of a flat stream, `qkv [N, 3H]` -> `[N, H]`.
    Real query rows always see at least one real key (every sentence has its EOS, every document a
    sentence, every decoder row its BOS), so no real row is ever fully masked (no NaN)."""
    n, width = qkv.shape
    hidden = width // 3
    head_dim = hidden // heads
    if layout.cu_seqlens is not None and qkv.is_cuda and _VARLEN_ATTENTION is not None and head_dim % 8 == 0:
        q, k, v = qkv.view(1, n, 3, heads, head_dim).unbind(2)
        cu, length = layout.cu_seqlens, layout.max_len
        out = _VARLEN_ATTENTION(q, k, v, None, cu, cu, length, length, 0.0, int(layout.causal), True)[0]
        return out.view(n, hidden)
    buckets = layout.buckets
    if buckets is not None:
        out = qkv.new_empty(n, hidden)
        for b in buckets:
            mask = None if layout.causal else b.key_mask  # causal: right padding is never attended
            part = _grid_attention(qkv.index_select(0, b.src), b.num_seqs, b.max_len, b.slot, mask, layout.causal,
                                   heads)
            out = out.index_copy(0, b.src, part) if torch.is_grad_enabled() else out.index_copy_(0, b.src, part)
        return out
    return _grid_attention(qkv, layout.num_seqs, layout.max_len, layout.index, layout.key_mask, layout.causal, heads)


def _grid_attention(qkv: Tensor, g: int, length: int, index: Tensor | None, key_mask: Tensor | None, causal: bool,
                    heads: int) -> Tensor:
    """Fused attention of `qkv [n, 3H]` placed at `index` on a zero [g, length] grid (None: it is the grid)."""
    width = qkv.shape[1]
    hidden = width // 3
    grid = qkv if index is None else qkv.new_zeros(g * length, width).index_copy_(0, index, qkv)
    q, k, v = grid.view(g, length, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4).unbind(0)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    if qkv.is_cuda:
        with sdpa_kernel(_CUDA_SDPA_BACKENDS):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    out = out.transpose(1, 2).reshape(g * length, hidden)
    return out if index is None else out.index_select(0, index)


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Fused attention; on CUDA without cuDNN attention, as in `attention` (it plans per shape, and
    decoding shapes change as documents finish)."""
    if q.is_cuda:
        with sdpa_kernel(_CUDA_SDPA_BACKENDS):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class TransformerLayer(nn.Module):
    """One encoder layer (HIBERT §3.1: self-attention + FFN, residuals, LayerNorm), or, given a `context`,
    one masked-sentence decoder layer (HIBERT §3.2, eq. 3–5): causal self-attention (eq. 3), then the
    document-level vector of the masked sentence is added (eq. 4), then the ReLU FFN (eq. 5).
    Post-LN as in the paper unless cfg.norm_first."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, f = cfg.hidden, cfg.ffn_dim
        self.heads = cfg.heads
        self.norm_first = cfg.norm_first
        self.qkv = nn.Linear(h, 3 * h)
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h)
        self.ffn_in = nn.Linear(h, f)
        self.ffn_out = nn.Linear(f, h)
        self.ffn_norm = nn.LayerNorm(h)
        # in place: the FFN's widest activation is not written twice (ffn_in's output is not kept for backward)
        self.act = nn.ReLU(inplace=True) if cfg.activation == "relu" else nn.GELU()
        self.dropout = nn.Dropout(cfg.dropout)

    def _attn(self, x: Tensor, layout: Layout) -> Tensor:
        return self.dropout(self.attn_out(attention(self.qkv(x), layout, self.heads)))

    def _ffn(self, x: Tensor) -> Tensor:
        return self.dropout(self.ffn_out(self.act(self.ffn_in(x))))

    def forward(self, x: Tensor, layout: Layout, context: Tensor | None = None) -> Tensor:
        if self.norm_first:
            x = x + self._attn(self.attn_norm(x), layout)
            if context is not None:
                x = x + context
            return x + self._ffn(self.ffn_norm(x))
        x = self.attn_norm(x + self._attn(x, layout))
        if context is not None:
            x = x + context
        return self.ffn_norm(x + self._ffn(x))


class TransformerStack(nn.Module):
    """`num_layers` TransformerLayers (+ a final LayerNorm when pre-LN), optionally checkpointed per layer
    so that only layer inputs are kept for the backward pass."""

    def __init__(self, cfg: ModelConfig, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden) if cfg.norm_first else nn.Identity()
        self.checkpointing = cfg.activation_checkpointing

    def forward(self, x: Tensor, layout: Layout, context: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            if self.checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, layout, context, use_reentrant=False)
            else:
                x = layer(x, layout, context)
        return self.final_norm(x)


def init_weights(module: nn.Module) -> None:
    """Xavier-uniform linears with zero bias; N(0, H^-1/2) embeddings (they are scaled by sqrt(H) on
    input, so the tied output projection starts with unit-scale logits)."""
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=module.embedding_dim ** -0.5)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
