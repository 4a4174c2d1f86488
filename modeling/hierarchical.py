"""Global (inter-unit) layers of the hierarchical transformer (Liu & Lapata 2019 §4; hiersumm's
`TransformerInterLayer` and `MultiHeadedPooling`), on top of the HIBERT encoder, which plays the local
layers: it has already contextualised every token within its sentence and every sentence within its unit.

One global layer, per head z (the paper's equations): score a^z and value b^z per token (13, 14), softmax of
the scores over the unit's tokens (15), head^z = LayerNorm(W_c^z sum_j a^z_j b^z_j) (16); q^z, k^z, v^z
projected from head^z with per-head weights (17-19), attention across the units of the same cluster (20,
scaled by 1/sqrt(d_head) as in Vaswani et al. and hiersumm); the heads' contexts concatenated and projected,
added to every token of the unit, then a position-wise FFN. hiersumm shares the q/k/v projections across
heads; the paper gives every head its own, and so do we. Optionally head 0's weights are the row-normalised
unit graph (eq. 24: graph-informed attention) and the pooled unit vectors go through structural attention
(matrix-tree marginals, modeling/structural.py) whose output joins the context.

`form="v0"` is the earlier simplification (q/k shared across heads, no W_c, LayerNorm or W_v), kept so that
exports made with it still load.

Positions (eq. 9-10): `rank_form="concat"` adds pe_ij = [e_i; e_j] — half-width sinusoids of the unit's rank i
and of the token's position j within its unit — where the paper adds it to the word embeddings; here the local
layers are a pretrained HIBERT with its own (within-sentence) positions, so it joins before the global layers.
`rank_form="full"` adds a full-width sinusoid of the rank alone (the earlier form).

Token-wise work runs on the flat stream of real tokens; only the [C, W] unit grid is padded.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hibert.modeling.clusters import UnitLayout
from hibert.modeling.layers import init_weights, sinusoidal_table
from hibert.modeling.structural import StructuralAttention


def unit_softmax(scores: Tensor, token_unit: Tensor, num_units: int) -> Tensor:
    """Softmax of `scores [N, h]` over the tokens of each unit (exact: shifted by each unit's max)."""
    index = token_unit[:, None].expand_as(scores)
    top = scores.new_full((num_units, scores.shape[1]), -math.inf).scatter_reduce(
        0, index, scores.detach(), "amax", include_self=True)
    e = (scores - top.gather(0, index)).exp()
    total = scores.new_zeros(num_units, scores.shape[1]).index_add(0, token_unit, e)
    return e / total.gather(0, index)


class HeadwiseLinear(nn.Module):
    """One d_in -> d_out linear per head (W^z of the paper): x [..., heads, d_in] -> [..., heads, d_out]."""

    def __init__(self, heads: int, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(heads, d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(heads, d_out))
        for z in range(heads):                     # Xavier-uniform per head, as init_weights does for linears
            nn.init.xavier_uniform_(self.weight[z])

    def forward(self, x: Tensor) -> Tensor:
        return torch.einsum("...hi,hio->...ho", x, self.weight.to(x.dtype)) + self.bias.to(x.dtype)


class MultiHeadPooling(nn.Module):
    """Per head, one vector per unit: sum over the unit's tokens of softmax(score) x value (eq. 13-15), then,
    with `project`, LayerNorm(W_c^z .) (eq. 16)."""

    def __init__(self, hidden: int, heads: int, project: bool = True):
        super().__init__()
        self.heads = heads
        self.score = nn.Linear(hidden, heads)
        self.value = nn.Linear(hidden, hidden)
        self.mix = HeadwiseLinear(heads, hidden // heads, hidden // heads) if project else None
        self.norm = nn.LayerNorm(hidden // heads) if project else None

    def forward(self, x: Tensor, layout: UnitLayout) -> tuple[Tensor, Tensor]:
        """x [N, H] -> (pooled [U, heads, H / heads], pooling weights [N, heads])."""
        n, h = x.shape
        weights = unit_softmax(self.score(x).float(), layout.token_unit, layout.num_units).to(x.dtype)
        values = self.value(x).view(n, self.heads, h // self.heads) * weights[..., None]
        # sums over a unit's tokens accumulate in fp32 (bf16 index_add loses ~0.3% over 400 tokens)
        pooled = values.new_zeros(layout.num_units, self.heads, h // self.heads, dtype=torch.float32).index_add(
            0, layout.token_unit, values.float()).to(x.dtype)
        if self.mix is not None:
            pooled = self.norm(self.mix(pooled))
        return pooled, weights


class GlobalLayer(nn.Module):
    """Pre-LN: x + dropout(context of x's unit), then x + FFN(LN(x))."""

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float, graph_attention: bool = False,
                 structural_attention: bool = False, form: Literal["liu_lapata", "v0"] = "liu_lapata",
                 structural_split: bool = True, structural_root: bool = True):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"global heads ({heads}) must divide hidden ({hidden})")
        self.heads, self.graph_attention, self.form = heads, graph_attention, form
        self.norm = nn.LayerNorm(hidden)
        d = hidden // heads
        self.pool = MultiHeadPooling(hidden, heads, project=form == "liu_lapata")
        if form == "liu_lapata":
            self.qkv = HeadwiseLinear(heads, d, 3 * d)                   # W_q^z, W_k^z, W_v^z (eq. 17-19)
        elif form == "v0":
            self.query, self.key = nn.Linear(d, d), nn.Linear(d, d)
        else:
            raise ValueError(f"unknown global layer form {form!r} (liu_lapata, v0)")
        self.out = nn.Linear(hidden, hidden)
        self.structure = (StructuralAttention(hidden, structural_split, structural_root) if structural_attention
                          else None)
        self.ffn_norm = nn.LayerNorm(hidden)
        self.ffn_in, self.ffn_out = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.dropout = nn.Dropout(dropout)

    def unit_weights(self, pooled: Tensor, layout: UnitLayout, graph: Tensor | None) -> tuple[Tensor, Tensor]:
        """Per head attention of every unit over the units of its cluster: ([C, heads, W, W], values
        [C, heads, W, d])."""
        c, w = layout.num_clusters, layout.max_units
        d = pooled.shape[-1]
        grid = pooled.new_zeros(c * w, self.heads, d).index_copy_(0, layout.unit_slot, pooled).view(c, w, self.heads, d)
        if self.form == "liu_lapata":
            q, k, v = self.qkv(grid).transpose(1, 2).split(d, dim=-1)    # each [C, heads, W, d]
        else:
            grid = grid.transpose(1, 2)
            q, k, v = self.query(grid), self.key(grid), grid
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        mask = layout.unit_mask[:, None, None, :]
        weights = torch.softmax(scores.float().masked_fill(~mask, -math.inf), dim=-1).to(v.dtype)
        if self.graph_attention:
            if graph is None:
                raise ValueError("graph-informed attention needs each cluster's unit graph")
            weights = torch.cat([graph_weights(graph, layout.unit_mask).to(weights.dtype)[:, None], weights[:, 1:]], 1)
        return weights, v

    def forward(self, x: Tensor, layout: UnitLayout, graph: Tensor | None = None) -> Tensor:
        return self.forward_with_structure(x, layout, graph)[0]

    def forward_with_structure(self, x: Tensor, layout: UnitLayout, graph: Tensor | None = None
                               ) -> tuple[Tensor, Tensor | None]:
        """-> (updated tokens [N, H], the structure-infused unit vectors [U, H] when structural attention is
        on, else None)."""
        pooled, _ = self.pool(self.norm(x), layout)                      # [U, heads, d]
        weights, values = self.unit_weights(pooled, layout, graph)
        ctx = (weights @ values).transpose(1, 2).reshape(layout.num_clusters * layout.max_units, -1)
        ctx = self.out(ctx)
        structure = None
        if self.structure is not None:                                   # over the pooled heads, concatenated
            c, w = layout.num_clusters, layout.max_units
            units = pooled.new_zeros(c * w, pooled.shape[1] * pooled.shape[2]).index_copy(
                0, layout.unit_slot, pooled.flatten(1)).view(c, w, -1)
            structure = self.structure(units, layout.unit_mask).reshape_as(ctx)
            ctx = ctx + structure
            structure = structure.index_select(0, layout.unit_slot)
        per_unit = ctx.index_select(0, layout.unit_slot)                 # [U, H]
        x = x + self.dropout(per_unit.index_select(0, layout.token_unit))
        return x + self.dropout(self.ffn_out(F.relu(self.ffn_in(self.ffn_norm(x))))), structure


def graph_weights(graph: Tensor, unit_mask: Tensor) -> Tensor:
    """Row-normalised graph over real units [C, W, W]: self loops kept, padding rows/columns 0."""
    real = unit_mask[:, :, None] & unit_mask[:, None, :]
    g = torch.where(real, graph.float(), torch.zeros_like(graph, dtype=torch.float32))
    eye = torch.eye(g.shape[-1], device=g.device, dtype=torch.bool)[None] & real
    g = torch.where(eye, torch.ones_like(g), g)
    total = g.sum(-1, keepdim=True)
    return torch.where(total > 0, g / total.clamp_min(1e-12), g)


def sinusoid(positions: Tensor, dim: int) -> Tensor:
    """`sinusoidal_table(n, dim)[positions]` for any positions, computed on their device (no table to size)."""
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) * (-math.log(10000.0) / dim))
    angle = positions.to(torch.float64)[:, None] * freq
    out = torch.zeros(positions.shape[0], dim, dtype=torch.float64, device=positions.device)
    out[:, 0::2] = torch.sin(angle)
    out[:, 1::2] = torch.cos(angle)[:, : dim // 2]
    return out.float()


def position_in_unit(token_unit: Tensor, num_units: int) -> Tensor:
    """[N] 0-based position of each token within its unit (a unit's tokens are contiguous in the stream)."""
    count = torch.zeros(num_units, dtype=torch.long, device=token_unit.device).index_add_(
        0, token_unit, torch.ones_like(token_unit))
    first = count.cumsum(0) - count
    return torch.arange(token_unit.shape[0], device=token_unit.device) - first[token_unit]


class GlobalEncoder(nn.Module):
    """Rank embedding (each unit's position in the ranked order, with `rank_form="concat"` concatenated with
    each token's position in its unit: eq. 9) added to its tokens + `layers` GlobalLayers + a final LayerNorm."""

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float, layers: int, graph_attention: bool = False,
                 structural_attention: bool = False, max_units: int = 64, rank_embedding: bool = True,
                 form: Literal["liu_lapata", "v0"] = "liu_lapata", structural_split: bool = True,
                 structural_root: bool = True, rank_form: Literal["concat", "full"] = "concat"):
        super().__init__()
        if rank_form not in ("concat", "full"):
            raise ValueError(f"unknown rank embedding form {rank_form!r} (concat, full)")
        self.max_units, self.rank_form = max_units, rank_form
        # concat: e_i takes the first half of the width, e_j the second (eq. 9: [e_i; e_j])
        self.rank_dim = hidden - hidden // 2 if rank_form == "concat" else hidden
        self.register_buffer("ranks", sinusoidal_table(max_units, self.rank_dim), persistent=False)
        self.rank_embedding = rank_embedding and layers > 0
        self.layers = nn.ModuleList(GlobalLayer(hidden, heads, ffn, dropout, graph_attention, structural_attention,
                                                form, structural_split, structural_root) for _ in range(layers))
        self.final_norm = nn.LayerNorm(hidden) if layers else nn.Identity()
        self.apply(init_weights)

    def forward(self, x: Tensor, layout: UnitLayout, graph: Tensor | None = None) -> Tensor:
        return self.forward_with_structure(x, layout, graph)[0]

    def forward_with_structure(self, x: Tensor, layout: UnitLayout, graph: Tensor | None = None
                               ) -> tuple[Tensor, Tensor | None]:
        """-> (token states [N, H], the last layer's structure-infused unit vectors [U, H] or None)."""
        if not self.layers:
            return x, None
        if self.rank_embedding:
            if layout.max_units > self.max_units:
                raise ValueError(f"{layout.max_units} units exceed mds.max_units {self.max_units}")
            pe = self.ranks[layout.unit_rank].index_select(0, layout.token_unit)
            if self.rank_form == "concat":
                pos = position_in_unit(layout.token_unit, layout.num_units)
                pe = torch.cat([pe, sinusoid(pos, x.shape[1] - self.rank_dim)], dim=1)
            x = x + pe.to(x.dtype)
        structure = None
        for layer in self.layers:
            x, structure = layer.forward_with_structure(x, layout, graph)
        return self.final_norm(x), structure
