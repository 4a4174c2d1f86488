"""The paragraph ranker of Liu & Lapata 2019 (§3) on HIBERT: every unit of a cluster is encoded like a
document (sentence encoder, then document encoder over the unit's sentences), its sentence states are pooled
into one vector, and a linear head scores it. Trained against each unit's ROUGE-2 recall of the target."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hibert.config.model import ModelConfig
from hibert.modeling.clusters import UnitLayout
from hibert.modeling.encoder import HibertEncoder
from hibert.modeling.layers import init_weights


class HibertRanker(nn.Module):
    """`.encoder` has the keys of every other HIBERT head, so registered encoders load strictly."""

    def __init__(self, cfg: ModelConfig, pool: str = "attention"):
        super().__init__()
        if pool not in ("mean", "attention"):
            raise ValueError(f"pool must be mean or attention, not {pool!r}")
        self.cfg, self.pool = cfg, pool
        self.encoder = HibertEncoder(cfg)
        self.pool_score = nn.Linear(cfg.hidden, 1) if pool == "attention" else None
        self.head = nn.Sequential(nn.LayerNorm(cfg.hidden), nn.Linear(cfg.hidden, 1))
        self.pool_score is not None and init_weights(self.pool_score)
        self.head.apply(init_weights)

    def unit_vectors(self, units) -> Tensor:
        """[U, H]: the pooled document-level sentence states of each unit (`units`: PackedDocuments)."""
        enc = self.encoder(units)
        states = enc.sentence_states                               # [S, H] rows in unit order
        unit = units.doc_index                                     # [S] unit of each sentence row
        n = units.num_docs
        if self.pool_score is None:
            w = torch.ones(states.shape[0], 1, dtype=states.dtype, device=states.device)
        else:
            s = self.pool_score(states).float()
            top = s.new_full((n, 1), -torch.inf).scatter_reduce(0, unit[:, None], s.detach(), "amax")
            w = (s - top[unit]).exp().to(states.dtype)
        total = w.new_zeros(n, 1, dtype=torch.float32).index_add(0, unit, w.float())   # fp32 sums (bf16 runs)
        pooled = states.new_zeros(n, states.shape[1], dtype=torch.float32).index_add(0, unit, (states * w).float())
        return (pooled / total).to(states.dtype)

    def forward(self, units) -> Tensor:
        """Scores [U] of the packed units (one logit each)."""
        return self.head(self.unit_vectors(units)).squeeze(-1)


def ranker_loss(scores: Tensor, labels: Tensor, layout: UnitLayout, kind: str) -> tuple[Tensor, int]:
    """(mean loss, clusters counted). `listwise`: cross-entropy between the labels normalised within each
    cluster and the softmax of the scores within it (clusters whose labels are all 0 carry no ranking and are
    left out); `regression`: binary cross-entropy of sigmoid(score) against the label (ROUGE-2 recall in
    [0, 1], a soft target), averaged over the units of each cluster, then over clusters."""
    c = layout.num_clusters
    cl = layout.unit_cluster
    labels = labels.float()
    scores = scores.float()
    if kind == "regression":
        per_unit = F.binary_cross_entropy_with_logits(scores, labels, reduction="none")
        count = torch.zeros(c, device=scores.device).index_add(0, cl, torch.ones_like(per_unit))
        per_cluster = torch.zeros(c, device=scores.device).index_add(0, cl, per_unit) / count
        return per_cluster.mean(), c
    if kind != "listwise":
        raise ValueError(f"ranker loss must be listwise or regression, not {kind!r}")
    total = torch.zeros(c, device=scores.device).index_add(0, cl, labels)
    keep = total > 0
    target = labels / torch.where(total > 0, total, 1.0)[cl]
    top = scores.new_full((c,), -torch.inf).scatter_reduce(0, cl, scores.detach(), "amax")
    z = torch.zeros(c, device=scores.device).index_add(0, cl, (scores - top[cl]).exp()).log() + top
    logp = scores - z[cl]
    per_cluster = -torch.zeros(c, device=scores.device).index_add(0, cl, target * logp)
    n = int(keep.sum())
    if n == 0:
        return scores.sum() * 0.0, 0
    return per_cluster[keep].sum() / n, n


def select_units(scores: np.ndarray, unit_tokens: np.ndarray, budget: int, top: int | None = None) -> np.ndarray:
    """Unit numbers by descending score (ties: document order) whose tokens fit `budget` (at least one),
    at most `top` of them."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    cum = np.cumsum(np.asarray(unit_tokens)[order])
    keep = max(1, int(np.searchsorted(cum, budget, side="right")))
    return order[: keep if top is None else min(keep, top)]
