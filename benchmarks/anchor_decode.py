"""The anchors' beam search, re-expressed on our model: the reference `bench_generate.py` measures
`modeling.generate` against.

PreSumm (`predictor.py::_fast_translate_batch`) and hiersumm (`predictor_builder.py`) decode B documents x K
beams the OpenNMT way; this module follows that strategy step for step, on `HibertAbstractive`'s own
layers, so that the comparison measures the search and its state handling, not two different models:

  * the encoder memory and every layer's memory keys/values are tiled K times (one copy per hypothesis),
    and the whole tiled state is gathered by the backpointers at every step (`index_select` of the memory
    and of each layer's cache);
  * the self-attention keys/values grow by `torch.cat` at every step;
  * the length penalty divides the candidate scores at every step; the top K of K x V candidates survive;
  * trigram blocking is a Python loop over every hypothesis at every step: its ids -> words, its trigrams,
    and a repeated last trigram sets that hypothesis's scores to -1e20;
  * a hypothesis that emits EOS stays in the beam; a document ends when its top beam finishes.

One departure: the minimum-length ban of EOS comes after the trigram check (see below), so that both searches
always do the same number of steps.

Where we could not follow them exactly we chose the anchors' favour: the memory projections are computed
once per document and then tiled (the anchors project the tiled memory, K times the work). Benchmarks only:
nothing in the platform calls this.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from hibert.tokens import BOS_ID, EOS_ID
from hibert.modeling.decoder import QueryLayout
from hibert.modeling.layers import sdpa
from hibert.modeling.packing import PackedDocuments
from hibert.modeling.source_memory import source_memory


class ConcatCache:
    """Per-layer self-attention keys/values [R, heads, t, d], grown by concatenation at every step."""

    def __init__(self, num_layers: int, heads: int):
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers
        self.heads = heads

    def attend(self, layer: int, qkv: Tensor) -> Tensor:
        r, width = qkv.shape
        hidden = width // 3
        q, k, v = (x.view(r, self.heads, 1, hidden // self.heads) for x in qkv.split(hidden, dim=1))
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return sdpa(q, k, v).view(r, hidden)

    def select(self, rows: Tensor) -> None:
        self.keys = [None if x is None else x.index_select(0, rows) for x in self.keys]
        self.values = [None if x is None else x.index_select(0, rows) for x in self.values]


def _words(ids: list[int], word_start: list[bool]) -> list[tuple[int, ...]]:
    """Split subword ids into words (a word-start piece opens a new word)."""
    words: list[list[int]] = []
    for i in ids:
        if word_start[i] or not words:
            words.append([i])
        else:
            words[-1].append(i)
    return [tuple(w) for w in words]


@torch.no_grad()
def anchor_generate(model, docs: PackedDocuments, beam: int, max_length: int, min_length: int, alpha: float,
                    block_trigram: bool, word_start: Tensor | None, never: tuple[int, ...] = ()) -> list[list[int]]:
    """Beam search the anchors' way; returns each document's best summary (subword ids, no BOS/EOS).
    `max_length` counts decoder steps (the anchors' meaning), the last one included. `never`: ids banned
    at every step (ours never generates PAD, <unk>, BOS, [MASK]; passing them makes the two searches
    choose among the same tokens)."""
    k, device = beam, docs.tokens.device
    b = docs.num_docs
    vocab = model.cfg.vocab_size
    memory = model.decoder.prepare(source_memory(model.encoder(docs), model.dec_cfg.add_sentence_vectors))
    tile = torch.arange(b, device=device).repeat_interleave(k)
    memory = [m.select(tile) for m in memory]                        # one copy of the memory per hypothesis
    cache = ConcatCache(len(model.decoder.layers), model.decoder.heads)
    starts = word_start.tolist() if word_start is not None else None
    alive = torch.full((b * k, 1), BOS_ID, dtype=torch.long, device=device)
    beam_scores = torch.tensor([0.0] + [float("-inf")] * (k - 1), device=device).repeat(b)
    offsets = torch.arange(0, b * k, k, device=device)
    doc_of = torch.arange(b, device=device)                          # original index of each open document
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    best: list[list[int]] = [[] for _ in range(b)]
    for step in range(max_length):
        r = alive.shape[0]
        emb = model.decoder.embed(alive[:, -1], torch.full((r,), step, device=device), model.input_table())
        queries = QueryLayout(r, 1)                                  # each tiled row is its own "document"
        hidden, context, attn, _ = model.decoder.run(emb, lambda i: lambda qkv: cache.attend(i, qkv), queries, memory)
        logp = model.decoder.log_probs(F.linear(hidden, model.output_weight()), hidden, context, attn, emb,
                                       queries, memory[-1])
        logp += beam_scores[:, None]
        penalty = ((5.0 + step + 1) / 6.0) ** alpha
        scores = logp / penalty
        if block_trigram and alive.shape[1] > 3:
            for i in range(r):                                       # the anchors' per-hypothesis loop
                words = _words(alive[i, 1:].tolist(), starts)
                if len(words) > 3:
                    trigrams = [tuple(words[j - 1:j + 2]) for j in range(1, len(words) - 1)]
                    if trigrams[-1] in trigrams[:-1]:
                        scores[i] = -10e20
        # the bans come after the trigram check (the anchors ban EOS before it: a document whose every beam
        # repeats a trigram then ends at an arbitrary tie, before min_length, doing less work than ours)
        if never:
            scores[:, list(never)] = float("-inf")
        if step < min_length:
            scores[:, EOS_ID] = float("-inf")
        top, index = scores.view(-1, k * vocab).topk(k, dim=-1)
        beam_scores = (top * penalty).view(-1)
        origin = torch.div(index, vocab, rounding_mode="floor")
        token = index - origin * vocab
        select = (origin + offsets[: origin.shape[0], None]).view(-1)
        alive = torch.cat([alive.index_select(0, select), token.view(-1, 1)], dim=-1)
        is_eos = token.eq(EOS_ID)
        if step + 1 == max_length:
            is_eos.fill_(True)
        ended = is_eos[:, 0]
        if is_eos.any():
            seqs = alive.view(-1, k, alive.shape[1])
            for i in range(is_eos.shape[0]):
                d = int(doc_of[i])
                if ended[i]:
                    is_eos[i].fill_(True)
                for j in torch.nonzero(is_eos[i]).view(-1).tolist():
                    finished[d].append((float(top[i, j]), seqs[i, j, 1:].tolist()))
                if ended[i]:
                    best[d] = max(finished[d], key=lambda x: x[0])[1]
            open_docs = torch.nonzero(~ended).view(-1)
            if open_docs.numel() == 0:
                break
            beam_scores = beam_scores.view(-1, k).index_select(0, open_docs).view(-1)
            select = select.view(-1, k).index_select(0, open_docs).view(-1)
            doc_of = doc_of.index_select(0, open_docs)
            alive = seqs.index_select(0, open_docs).view(-1, alive.shape[1])
        memory = [m.select(select) for m in memory]                  # the whole tiled state, every step
        cache.select(select)
    return [[t for t in ids if t != EOS_ID] for ids in best]
