"""The paragraph ranker of Liu & Lapata 2019 (§3) on HIBERT: every unit of a cluster is encoded like a
document (sentence encoder, then document encoder over the unit's sentences) and scored by a linear head on
one vector per unit. Trained against each unit's ROUGE-2 recall of the target.

Unit vector (`pool`): "title" is the paper's eq. 1-6 — the title encoded by the same encoder and max-pooled
(û_t, eq. 3), concatenated to every token vector of the unit, p_i = tanh(W_1 [u_pi; û_t]) (eq. 4), max-pooled
over the unit (eq. 5), then the linear head (eq. 6; the sigmoid is in the loss). A cluster without a title
conditions on its centroid instead: the mean over its units of their max-pooled token vectors (the same
space as û_t). "mean" / "attention" pool each unit's sentence states alone (no title), as exports made before
the title pool were trained."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hibert.config.model import ModelConfig
from hibert.modeling.clusters import UnitLayout, pack_clusters
from hibert.modeling.encoder import HibertEncoder
from hibert.modeling.layers import init_weights
from hibert.modeling.packing import PackedDocuments, TensorBundle, pack_documents

POOLS = ("title", "mean", "attention")


@dataclass
class RankerInput(TensorBundle):
    """The units of C clusters (`units`, cluster-major) with the cluster of each unit and each cluster's title
    (`titles`: one packed document per cluster, a placeholder where `has_title` is False)."""

    units: PackedDocuments
    layout: UnitLayout          # where each unit sits (`layout.unit_cluster`: the cluster of each unit)
    titles: PackedDocuments
    has_title: Tensor           # [C] bool

    @property
    def unit_cluster(self) -> Tensor:
        return self.layout.unit_cluster


def _segment_max(x: Tensor, segment: Tensor, n: int) -> Tensor:
    """Max of rows `x [N, H]` within each of n segments (every segment non-empty)."""
    return x.new_full((n, x.shape[1]), float("-inf")).scatter_reduce(
        0, segment[:, None].expand_as(x), x, "amax", include_self=True)


def _token_vectors(encoder: HibertEncoder, docs: PackedDocuments) -> tuple[Tensor, Tensor]:
    """(token vectors [N, H] = sentence-level state + its sentence's document-level vector, document of each)."""
    enc = encoder(docs)
    rows = torch.repeat_interleave(torch.arange(docs.tokens.shape[0], device=docs.sent_lens.device), docs.sent_lens,
                                   output_size=docs.num_real_tokens)
    return enc.token_flat + enc.sentence_states.index_select(0, rows), docs.doc_index[rows]


class HibertRanker(nn.Module):
    """`.encoder` has the keys of every other HIBERT head, so registered encoders load strictly."""

    def __init__(self, cfg: ModelConfig, pool: str = "title"):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {', '.join(POOLS)}, not {pool!r}")
        self.cfg, self.pool = cfg, pool
        self.encoder = HibertEncoder(cfg)
        self.pool_score = nn.Linear(cfg.hidden, 1) if pool == "attention" else None
        self.match = nn.Linear(2 * cfg.hidden, cfg.hidden) if pool == "title" else None   # W_1 of eq. 4
        self.head = nn.Sequential(nn.LayerNorm(cfg.hidden), nn.Linear(cfg.hidden, 1))
        for m in (self.pool_score, self.match):
            if m is not None:
                init_weights(m)
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

    def title_matched_vectors(self, inp: RankerInput) -> Tensor:
        """[U, H]: p̂ of eq. 4-5 for every unit, conditioned on its cluster's title (or centroid)."""
        tokens, unit = _token_vectors(self.encoder, inp.units)              # u_pi, eq. 2
        n_units, n_clusters = inp.units.num_docs, inp.has_title.shape[0]
        unit_max = _segment_max(tokens.float(), unit, n_units)              # max-pooled unit vectors
        title_tokens, title_doc = _token_vectors(self.encoder, inp.titles)  # u_ti, eq. 1
        title = _segment_max(title_tokens.float(), title_doc, n_clusters)   # û_t, eq. 3
        count = torch.zeros(n_clusters, 1, device=tokens.device).index_add_(
            0, inp.unit_cluster, torch.ones(n_units, 1, device=tokens.device))
        centroid = torch.zeros_like(title).index_add_(0, inp.unit_cluster, unit_max) / count.clamp_min(1)
        cond = torch.where(inp.has_title[:, None], title, centroid).to(tokens.dtype)
        per_token = cond.index_select(0, inp.unit_cluster).index_select(0, unit)
        p = torch.tanh(self.match(torch.cat([tokens, per_token], dim=-1)))  # eq. 4
        return _segment_max(p.float(), unit, n_units).to(tokens.dtype)     # eq. 5

    def forward(self, inp) -> Tensor:
        """Scores [U] (one logit each) of a `RankerInput` (the title pool needs one) or of packed units."""
        if self.pool == "title":
            if not isinstance(inp, RankerInput):
                raise ValueError("the title-conditioned ranker reads a RankerInput (units, their clusters, titles)")
            return self.head(self.title_matched_vectors(inp)).squeeze(-1)
        units = inp.units if isinstance(inp, RankerInput) else inp
        return self.head(self.unit_vectors(units)).squeeze(-1)


def ranker_input(clusters, titles, pad_to_multiple: int = 8) -> RankerInput:
    """The ranker's input for C clusters (each a list of units; a unit is a list of sentences of token ids) and
    their titles (each a list of sentences of token ids, or None)."""
    packed = pack_clusters(clusters, None, pad_to_multiple)
    has = [t is not None and sum(len(s) for s in t) > 0 for t in titles]
    docs = [t if h else [np.zeros(0, np.int64)] for t, h in zip(titles, has)]  # placeholder: one EOS
    return RankerInput(units=packed.units, layout=packed.layout, titles=pack_documents(docs, pad_to_multiple),
                       has_title=torch.tensor(has, dtype=torch.bool))


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
