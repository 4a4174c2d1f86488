"""Padding-free batch layout of document clusters (multi-document summarization, Liu & Lapata 2019).

A cluster is a list of units (paragraphs, or windows of a few sentences); a unit is encoded by HIBERT
exactly like a document. A batch of C clusters holds U units in all: `pack_documents` lays the units out
(cluster-major) for the local (HIBERT) encoder; `UnitLayout` says which cluster each unit belongs to and
where it sits on the small [C, W] unit grid (W = most units in a cluster) that inter-unit attention uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from hibert.modeling.packing import Document, PackedDocuments, TensorBundle, pack_documents, ragged_slots, round_up
from hibert.tokens import EOS_ID


@dataclass
class UnitLayout(TensorBundle):
    """Where every unit and every memory token of C clusters sits."""

    unit_cluster: Tensor   # [U] cluster of each unit (units are cluster-major)
    unit_slot: Tensor      # [U] slot in the flat C*W unit grid
    unit_mask: Tensor      # [C, W] bool, True = a real unit
    unit_rank: Tensor      # [U] 0-based position of the unit in its cluster (its rank when ranked)
    token_unit: Tensor     # [N] unit of each token of the flat token stream (the encoder's computed slots)

    @property
    def num_clusters(self) -> int:
        return self.unit_mask.shape[0]

    @property
    def max_units(self) -> int:
        return self.unit_mask.shape[1]

    @property
    def num_units(self) -> int:
        return self.unit_cluster.shape[0]


@dataclass
class PackedClusters(TensorBundle):
    """C clusters: their U units packed for the local encoder (`units`, cluster-major, each unit a
    document), where each unit sits (`layout`), the unit graphs for graph-informed attention (`graph
    [C, W, W]`, or None) and `memory_docs`: the same tokens packed as one "document" per cluster whose
    "sentences" are the units (words + EOS of every sentence of the unit) — the decoder memory's layout."""

    units: PackedDocuments
    layout: UnitLayout
    memory_docs: PackedDocuments
    graph: Tensor | None = None

    @property
    def num_docs(self) -> int:     # the generator's "documents" are clusters
        return self.layout.num_clusters

    @property
    def tokens(self) -> Tensor:    # the generator reads the device from here
        return self.units.tokens


def pack_clusters(clusters: Sequence[Sequence[Document]], graphs: Sequence[np.ndarray] | None = None,
                  pad_to_multiple: int = 8) -> PackedClusters:
    """Pack clusters (lists of units; a unit is a list of sentences of token ids). The order of the units in
    each cluster is their rank order. `graphs`: one [n_units, n_units] matrix per cluster (hibert.tfidf.unit_graph)."""
    if len(clusters) == 0:
        raise ValueError("a batch needs at least one cluster")
    counts = np.fromiter((len(c) for c in clusters), dtype=np.int64, count=len(clusters))
    if (counts == 0).any():
        raise ValueError(f"cluster {int(np.argmin(counts))} has no units")
    units = [u for c in clusters for u in c]
    packed = pack_documents(units, pad_to_multiple)
    width = round_up(int(counts.max()), 1)
    unit_slot, unit_rank = ragged_slots(counts, width)
    unit_tokens = np.fromiter((sum(len(s) + 1 for s in u) for u in units), dtype=np.int64, count=len(units))
    token_unit = np.repeat(np.arange(len(units), dtype=np.int64), unit_tokens)
    # the memory view: each unit's sentences (with their EOS) back to back as one row; pack_documents adds
    # the last EOS itself, so the row holds exactly the unit's tokens in encoder stream order
    eos = np.array([EOS_ID], dtype=np.int64)
    rows = [np.concatenate([x for s in u for x in (np.asarray(s, dtype=np.int64), eos)])[:-1] for u in units]
    starts = np.concatenate([[0], np.cumsum(counts)])
    memory = pack_documents([rows[a:b] for a, b in zip(starts[:-1], starts[1:])], pad_to_multiple)
    graph = None
    if graphs is not None:
        if len(graphs) != len(clusters):
            raise ValueError(f"{len(graphs)} graphs for {len(clusters)} clusters")
        g = np.zeros((len(clusters), width, width), dtype=np.float32)
        for i, (gi, n) in enumerate(zip(graphs, counts.tolist())):
            gi = np.asarray(gi, dtype=np.float32)
            if gi.shape[0] < n or gi.shape[1] < n:
                raise ValueError(f"graph {i} is {gi.shape} for {n} units")
            g[i, :n, :n] = gi[:n, :n]
        graph = torch.from_numpy(g)
    t = torch.from_numpy
    layout = UnitLayout(unit_cluster=t(np.repeat(np.arange(len(clusters), dtype=np.int64), counts)),
                        unit_slot=t(unit_slot), unit_mask=t(np.arange(width) < counts[:, None]),
                        unit_rank=t(unit_rank), token_unit=t(token_unit))
    return PackedClusters(packed, layout, memory, graph)
