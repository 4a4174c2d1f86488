"""Global (inter-unit) layers of the hierarchical transformer (Liu & Lapata 2019 §4; hiersumm's
`TransformerInterLayer` and `MultiHeadedPooling`), on top of the HIBERT encoder, which plays the local
layers: it has already contextualised every token within its sentence and every sentence within its unit.

One global layer, per head h: pool each unit's tokens into one vector (a softmax over the unit's tokens of a
learned score, weighting learned values), attend across the units of the same cluster, concatenate the heads
and project; that context is added to every token of the unit, then a position-wise FFN. Optionally head 0's
weights are the row-normalised unit graph (eq. 24: graph-informed attention) and the pooled unit vectors go
through structural attention (matrix-tree marginals, modeling/structural.py) whose output joins the context.

Token-wise work runs on the flat stream of real tokens; only the [C, W] unit grid is padded.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modeling.clusters import UnitLayout
from modeling.layers import init_weights, sinusoidal_table
from modeling.structural import StructuralAttention


def unit_softmax(scores: Tensor, token_unit: Tensor, num_units: int) -> Tensor:
    """Softmax of `scores [N, h]` over the tokens of each unit (exact: shifted by each unit's max)."""
    index = token_unit[:, None].expand_as(scores)
    top = scores.new_full((num_units, scores.shape[1]), -math.inf).scatter_reduce(
        0, index, scores.detach(), "amax", include_self=True)
    e = (scores - top.gather(0, index)).exp()
    total = scores.new_zeros(num_units, scores.shape[1]).index_add(0, token_unit, e)
    return e / total.gather(0, index)


class MultiHeadPooling(nn.Module):
    """Per head, one vector per unit: sum over the unit's tokens of softmax(score) x value."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.score = nn.Linear(hidden, heads)
        self.value = nn.Linear(hidden, hidden)

    def forward(self, x: Tensor, layout: UnitLayout) -> tuple[Tensor, Tensor]:
        """x [N, H] -> (pooled [U, heads, H / heads], pooling weights [N, heads])."""
        n, h = x.shape
        weights = unit_softmax(self.score(x).float(), layout.token_unit, layout.num_units).to(x.dtype)
        values = self.value(x).view(n, self.heads, h // self.heads) * weights[..., None]
        # sums over a unit's tokens accumulate in fp32 (bf16 index_add loses ~0.3% over 400 tokens)
        pooled = values.new_zeros(layout.num_units, self.heads, h // self.heads, dtype=torch.float32).index_add(
            0, layout.token_unit, values.float())
        return pooled.to(x.dtype), weights


class GlobalLayer(nn.Module):
    """Pre-LN: x + dropout(context of x's unit), then x + FFN(LN(x))."""

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float, graph_attention: bool = False,
                 structural_attention: bool = False):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"global heads ({heads}) must divide hidden ({hidden})")
        self.heads, self.graph_attention = heads, graph_attention
        self.norm = nn.LayerNorm(hidden)
        self.pool = MultiHeadPooling(hidden, heads)
        self.query = nn.Linear(hidden // heads, hidden // heads)
        self.key = nn.Linear(hidden // heads, hidden // heads)
        self.out = nn.Linear(hidden, hidden)
        self.structure = StructuralAttention(hidden) if structural_attention else None
        self.ffn_norm = nn.LayerNorm(hidden)
        self.ffn_in, self.ffn_out = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.dropout = nn.Dropout(dropout)

    def unit_weights(self, pooled: Tensor, layout: UnitLayout, graph: Tensor | None) -> tuple[Tensor, Tensor]:
        """Per head attention of every unit over the units of its cluster: ([C, heads, W, W], grid values)."""
        c, w = layout.num_clusters, layout.max_units
        d = pooled.shape[-1]
        grid = pooled.new_zeros(c * w, self.heads, d).index_copy(0, layout.unit_slot, pooled).view(c, w, self.heads, d)
        grid = grid.transpose(1, 2)                                      # [C, heads, W, d]
        scores = self.query(grid) @ self.key(grid).transpose(-1, -2) / math.sqrt(d)
        mask = layout.unit_mask[:, None, None, :]
        weights = torch.softmax(scores.float().masked_fill(~mask, -math.inf), dim=-1).to(grid.dtype)
        if self.graph_attention:
            if graph is None:
                raise ValueError("graph-informed attention needs each cluster's unit graph")
            weights = torch.cat([graph_weights(graph, layout.unit_mask).to(weights.dtype)[:, None], weights[:, 1:]], 1)
        return weights, grid

    def forward(self, x: Tensor, layout: UnitLayout, graph: Tensor | None = None) -> Tensor:
        pooled, _ = self.pool(self.norm(x), layout)                      # [U, heads, d]
        weights, grid = self.unit_weights(pooled, layout, graph)
        ctx = (weights @ grid).transpose(1, 2).reshape(layout.num_clusters * layout.max_units, -1)
        ctx = self.out(ctx)
        if self.structure is not None:
            units = grid.transpose(1, 2).reshape(layout.num_clusters, layout.max_units, -1)
            ctx = ctx + self.structure(units, layout.unit_mask).reshape_as(ctx)
        per_unit = ctx.index_select(0, layout.unit_slot)                 # [U, H]
        x = x + self.dropout(per_unit.index_select(0, layout.token_unit))
        return x + self.dropout(self.ffn_out(F.relu(self.ffn_in(self.ffn_norm(x)))))


def graph_weights(graph: Tensor, unit_mask: Tensor) -> Tensor:
    """Row-normalised graph over real units [C, W, W]: self loops kept, padding rows/columns 0."""
    real = unit_mask[:, :, None] & unit_mask[:, None, :]
    g = torch.where(real, graph.float(), torch.zeros_like(graph, dtype=torch.float32))
    eye = torch.eye(g.shape[-1], device=g.device, dtype=torch.bool)[None] & real
    g = torch.where(eye, torch.ones_like(g), g)
    total = g.sum(-1, keepdim=True)
    return torch.where(total > 0, g / total.clamp_min(1e-12), g)


class GlobalEncoder(nn.Module):
    """Rank embedding (each unit's position in the ranked order, added to its tokens) + `layers` GlobalLayers
    + a final LayerNorm."""

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float, layers: int, graph_attention: bool = False,
                 structural_attention: bool = False, max_units: int = 64, rank_embedding: bool = True):
        super().__init__()
        self.max_units = max_units
        self.register_buffer("ranks", sinusoidal_table(max_units, hidden), persistent=False)
        self.rank_embedding = rank_embedding and layers > 0
        self.layers = nn.ModuleList(GlobalLayer(hidden, heads, ffn, dropout, graph_attention, structural_attention)
                                    for _ in range(layers))
        self.final_norm = nn.LayerNorm(hidden) if layers else nn.Identity()
        self.apply(init_weights)

    def forward(self, x: Tensor, layout: UnitLayout, graph: Tensor | None = None) -> Tensor:
        if not self.layers:
            return x
        if self.rank_embedding:
            if layout.max_units > self.max_units:
                raise ValueError(f"{layout.max_units} units exceed mds.max_units {self.max_units}")
            x = x + self.ranks[layout.unit_rank].to(x.dtype).index_select(0, layout.token_unit)
        for layer in self.layers:
            x = layer(x, layout, graph)
        return self.final_norm(x)
