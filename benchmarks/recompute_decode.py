"""Decoding without the self-attention cache: every step runs the whole prefix through the decoder again
(teacher-forcing style) and keeps the last position. What `bench_generate.py` measures the KV cache against,
and the tests' reference for the cached step (`decode_prefix` must give `decode_step`'s log-probs).
Benchmarks and tests only: nothing in the platform calls this.

Queries on the cross-attention grid: Q = beams x prefix (each document's memory K/V still computed once);
the coverage recurrence restarts at every prefix (`CoverageInput(period=t)`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from hibert.modeling.decoder import CoverageInput, QueryLayout
from hibert.modeling.kv_cache import CrossCache, DecodeState
from hibert.modeling.layers import Layout, attention
from hibert.modeling.packing import PackedDocuments


def decode_prefix(model, prefix: Tensor, memory: list[CrossCache]) -> Tensor:
    """`model.decode_step`'s log-probs without a cache: the whole prefix `[R, t]` (BOS first) through the
    decoder of a `HibertAbstractive` (or `HibertMDS`) again (teacher-forcing style), last position kept."""
    r, t = prefix.shape
    model.check_positions(t)
    b = memory[0].keys.shape[0]
    pos = torch.arange(t, device=prefix.device).repeat(r)
    emb = model.decoder.embed(prefix.reshape(-1), pos, model.input_table())
    layout = Layout(r, t, causal=True)
    queries = QueryLayout(b, r // b * t)
    heads = model.decoder.heads
    hidden, context, attn, _ = model.decoder.run(emb, lambda i: lambda qkv: attention(qkv, layout, heads),
                                                 queries, memory, CoverageInput(period=t))
    last = torch.arange(r, device=prefix.device) * t + t - 1
    pick = lambda x: None if x is None else x.index_select(0, last)  # noqa: E731
    # the copy mixture of the kept rows: one query per hypothesis on a [B, K] grid
    hidden, kept = pick(hidden), QueryLayout(b, r // b)
    logits, context = model.decoder.vocab_logits(hidden, pick(context), kept, memory[-1], model.output_weight())
    return model.decoder.log_probs(logits, hidden, context, pick(attn), pick(emb), kept, memory[-1])


class PrefixState:
    """A `DecodeState` plus every hypothesis' prefix so far [R, t] (BOS first), reordered with the beams."""

    def __init__(self, state: DecodeState):
        self.state = state
        self.prefix: Tensor | None = None

    @property
    def memory(self) -> list[CrossCache]:
        return self.state.memory

    def reorder(self, rows: Tensor, keep_docs: Tensor | None = None) -> None:
        self.state.reorder(rows, keep_docs)
        self.prefix = self.prefix.index_select(0, rows)


class RecomputePrefix:
    """`modeling.generate.generate`'s model, recomputing the prefix at every step instead of using the
    self-attention cache: `generate(RecomputePrefix(model), docs, gen)` runs the same search as
    `generate(model, docs, gen)` on `decode_prefix`'s log-probs."""

    def __init__(self, model):
        self.model = model
        self.cfg = model.cfg

    def start_decoding(self, docs: PackedDocuments, beams: int, max_len: int) -> PrefixState:
        return PrefixState(self.model.start_decoding(docs, beams, max_len))

    def decode_step(self, tokens: Tensor, state: PrefixState) -> Tensor:
        step = tokens[:, None]
        state.prefix = step if state.prefix is None else torch.cat([state.prefix, step], 1)
        return decode_prefix(self.model, state.prefix, state.memory)
