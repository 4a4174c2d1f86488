"""Batched beam search (and greedy = beam 1) for `HibertAbstractive`.

B documents x K beams decode together. The encoder runs once; every decoder layer's memory K/V is
projected once per document and never tiled over beams (beams are the query axis of cross-attention);
the self-attention K/V live in a preallocated cache written once, each hypothesis seeing its ancestors'
entries (backpointers reorder a small mask, never the keys/values).
Per step the Python work is a fixed number of tensor ops whatever B and K are; finished hypotheses go to
a per-document pool (tensors, merged with one sort), and documents that are done leave the batch.

The rules that edit the log-probs (length limits, n-gram blocking, the word-piece cap) are logits
processors (modeling/logits_process.py); this loop applies them in order and keeps them in step with the
beams. What they and the search do, all in subwords:
  * length = subwords of the summary, EOS not counted. EOS is banned while length < min_length and is
    the only candidate once length == max_length. PAD, <unk>, BOS and [MASK] are never generated.
  * score of a finished hypothesis = (sum of log-probs, EOS included) / lp, with the GNMT length penalty
    lp = ((5 + |Y|) / 6) ** alpha, |Y| = subwords + 1 (the EOS).
  * candidates: the 2K best (beam score + log-prob) over all K x V extensions, ordered by score, ties by
    (beam, token) index. An EOS candidate among the first K goes to the pool; the first K non-EOS ones
    are the next beams.
  * early stopping (exact): log-probs are <= 0, so an open beam with score s can at best finish with
    s / lp(max_length + 1) (alpha > 0; s when alpha = 0). A document stops once its n_best-th finished
    score reaches the best open beam's bound, so stopping early never changes the result: with
    early_stopping off every document runs to max_length and returns the same hypotheses.
  * no-repeat n-gram blocking on words (see `NgramBlocker`), copy-aware: with a pointer-generator the
    search runs on the mixture's log-probs, as everything else does.
  * at most `max_word_pieces` pieces per word (0 = no cap; see `WordPieceCap`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from hibert.config.abstractive import GenerationConfig
from hibert.modeling.logits_process import NEVER_GENERATED, NgramBlocker, SearchShape, WordPieceCap, build_processors  # noqa: F401
from hibert.modeling.packing import PackedDocuments
from hibert.tokens import BOS_ID, EOS_ID


@dataclass
class Hypothesis:
    tokens: list[int]          # summary subwords, no BOS/EOS
    score: float               # log_prob / GNMT length penalty
    log_prob: float            # sum of the log-probs of the subwords and the EOS
    finished: bool = True      # False only if every beam died first (all continuations blocked): see _fallback
    nbest: list["Hypothesis"] = field(default_factory=list)  # the n best, this one first


def gnmt_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """Wu et al. 2016: ((5 + |Y|) / 6) ** alpha."""
    return ((5 + length) / 6) ** alpha


class _Pool:
    """Finished hypotheses: the K best per document, sorted (ties: the earlier found first)."""

    def __init__(self, docs: int, k: int, max_len: int, device: torch.device):
        self.score = torch.full((docs, k), float("-inf"), device=device)
        self.log_prob = torch.full((docs, k), float("-inf"), device=device)
        self.length = torch.zeros(docs, k, dtype=torch.long, device=device)
        self.finished = torch.ones(docs, k, dtype=torch.bool, device=device)
        self.tokens = torch.zeros(docs, k, max_len, dtype=torch.long, device=device)

    def add(self, docs: Tensor, score: Tensor, log_prob: Tensor, length: Tensor, tokens: Tensor,
            finished: Tensor) -> None:
        """Merge candidates [Ba, C] (score -inf = not a candidate) into the pools of `docs [Ba]`."""
        k = self.score.shape[1]
        merged = torch.cat([self.score[docs], score], 1)
        order = merged.sort(dim=1, descending=True, stable=True).indices[:, :k]
        pick = lambda old, new: torch.cat([old[docs], new], 1).gather(1, order)  # noqa: E731
        self.score[docs] = merged.gather(1, order)
        self.log_prob[docs] = pick(self.log_prob, log_prob)
        self.length[docs] = pick(self.length, length)
        self.finished[docs] = pick(self.finished, finished)
        self.tokens[docs] = torch.cat([self.tokens[docs], tokens], 1).gather(
            1, order[..., None].expand(-1, -1, self.tokens.shape[2]))

    def hypotheses(self, n_best: int) -> list[Hypothesis]:
        score, log_prob, length, finished, tokens = (x.cpu() for x in (self.score, self.log_prob, self.length,
                                                                        self.finished, self.tokens))
        out = []
        for b in range(score.shape[0]):
            nbest = [Hypothesis(tokens[b, j, : length[b, j]].tolist(), float(score[b, j]), float(log_prob[b, j]),
                                bool(finished[b, j])) for j in range(n_best) if score[b, j] > float("-inf")]
            best = nbest[0] if nbest else Hypothesis([], float("-inf"), float("-inf"), False)
            best.nbest = nbest
            out.append(best)
        return out


_CHUNK = 128  # candidates per block of the top-k prefilter


def _top_candidates(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k best of each row, best first, equal scores by lower index (-inf ones in any order: never used).

    A row holds K x V candidates (160,000 for beam 5 and 32,000 pieces); topk over it is a slow partial
    sort on the CPU (3 ms per step for 16 documents on 2 cores). The k best lie in the k blocks of _CHUNK
    consecutive candidates with the best maxima (any other block is beaten by k block maxima), ordering
    blocks by (maximum, lower index) as candidates are ordered: one max pass, then topk over k blocks."""
    rows, n = scores.shape
    whole = n - n % _CHUNK
    if whole < 4 * k * _CHUNK:
        return _ordered_topk(scores, k)
    block_max = scores[:, :whole].view(rows, whole // _CHUNK, _CHUNK).amax(-1)
    blocks = _ordered_topk(block_max, k)[1].sort(dim=1).values                          # [rows, k], ascending
    index = (blocks[..., None] * _CHUNK + torch.arange(_CHUNK, device=scores.device)).flatten(1)
    if whole < n:  # the tail that fills no block is always a candidate
        index = torch.cat([index, torch.arange(whole, n, device=scores.device).expand(rows, -1)], 1)
    top, pos = _ordered_topk(scores.gather(1, index), k)  # index is increasing: ties keep the lower index
    return top, index.gather(1, pos)


def _ordered_topk(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k best, best first, equal scores by lower index. topk may pick any of the candidates tied at
    the k-th score, and a stable sort is slow on the CPU (1 ms for 16 x 1,250): topk finds the k-th score,
    the candidates above it and the first ones equal to it are kept, a second topk on their negated
    positions lists them (no host sync), and the k are sorted stably by score."""
    kth = scores.topk(k, dim=1).values[:, -1:]
    above, tied = scores > kth, scores == kth
    keep = above | (tied & (tied.cumsum(1) <= k - above.sum(1, keepdim=True)))
    position = torch.arange(scores.shape[1], device=scores.device, dtype=torch.float32)  # exact below 2^24
    index = torch.where(keep, -position, float("-inf")).topk(k, dim=1).indices
    top, order = scores.gather(1, index).sort(dim=1, descending=True, stable=True)
    return top, index.gather(1, order)


@torch.no_grad()
def generate(model, docs: PackedDocuments, gen: GenerationConfig, word_start: Tensor | None = None,
             n_best: int = 1, trace: Callable[[int, Tensor, Tensor], None] | None = None) -> list[Hypothesis]:
    """Beam search over every document of `docs` (packed layout, on the model's device) with a
    `HibertAbstractive` in eval mode (callers wrap it in autocast for bf16). `word_start [V]` bool marks
    the pieces that begin a word (needed when gen.no_repeat_ngram or gen.max_word_pieces > 0). Returns one `Hypothesis` per
    document, in order, with its `n_best` best in `.nbest`. `model` is used through `cfg`, `start_decoding` and
    `decode_step` only (benchmarks/recompute_decode.py wraps one that recomputes the whole prefix at every
    step instead of using the self-attention cache). `trace(step, prefixes [R, t], banned [R, V])` sees the
    n-gram blocker's decision at every step (tests)."""
    k, max_len, alpha = gen.beam_size, gen.max_length, gen.length_penalty
    if not 1 <= n_best <= k:
        raise ValueError(f"n_best ({n_best}) must be between 1 and beam_size ({k})")
    vocab = model.cfg.vocab_size
    device = docs.tokens.device
    num_docs = docs.num_docs
    processors = build_processors(gen, SearchShape(num_docs * k, vocab, max_len, device, word_start))
    blocker = next((p for p in processors if isinstance(p, NgramBlocker)), None)
    state = model.start_decoding(docs, k, max_len + 1)
    doc_ids = torch.arange(num_docs, device=device)                # original index of each open document
    scores = torch.full((num_docs, k), float("-inf"), device=device)
    scores[:, 0] = 0.0                                              # one live beam to start from
    history = torch.zeros(num_docs, k, max_len, dtype=torch.long, device=device)
    prefix_scores = torch.zeros(num_docs, k, max_len, device=device)  # log p of each prefix (for `_fallback`)
    pool = _Pool(num_docs, k, max_len, device)
    bound_penalty = gnmt_penalty(max_len + 1, alpha)
    inputs = torch.full((num_docs * k,), BOS_ID, dtype=torch.long, device=device)
    rank = torch.arange(2 * k, device=device)

    for t in range(max_len + 1):
        b = doc_ids.shape[0]
        logp = model.decode_step(inputs, state)
        if blocker is not None and trace is not None:
            blocker.on_mask = lambda mask: trace(t, history.view(b * k, max_len)[:, :t], mask)  # noqa: B023
        for rule in processors:
            rule(t, logp)
        cand = logp.view(b, k, vocab).add_(scores[..., None]).view(b, k * vocab)
        top, index = _top_candidates(cand, min(2 * k, k * vocab))
        beam = torch.div(index, vocab, rounding_mode="floor")    # integer backpointers
        token = index - beam * vocab
        valid = top > float("-inf")
        is_eos = token == EOS_ID

        finish = is_eos & valid & (rank[: top.shape[1]] < k)
        drop = is_eos | ~valid
        order = drop.to(torch.int8).sort(dim=1, stable=True).indices[:, :k]  # first K live, in score order
        new_scores = top.gather(1, order).masked_fill(drop.gather(1, order), float("-inf"))
        new_beam, new_token = beam.gather(1, order), token.gather(1, order)

        # finished candidates join the pool (a few small ops, no need to check first: no host sync)
        ended = history.gather(1, beam[..., None].expand(-1, -1, max_len))
        pool.add(doc_ids, torch.where(finish, top / gnmt_penalty(t + 1, alpha), float("-inf")), top,
                 torch.full_like(beam, t), ended, torch.ones_like(finish))
        best_open = new_scores[:, 0]
        done = ~torch.isfinite(best_open) | (t == max_len)
        if gen.early_stopping:
            done |= pool.score[doc_ids, n_best - 1] >= best_open / bound_penalty
        any_done, all_done = torch.stack([done.any(), done.all()]).tolist()  # the one host sync per step
        if any_done:
            _fallback(pool, doc_ids, done, scores, history, prefix_scores, t, alpha, blocker)
            if all_done:
                break
        rows = (torch.arange(b, device=device)[:, None] * k + new_beam)       # [b, K] backpointers
        history = history.gather(1, new_beam[..., None].expand(-1, -1, max_len))
        prefix_scores = prefix_scores.gather(1, new_beam[..., None].expand(-1, -1, max_len))
        history[:, :, t], prefix_scores[:, :, t] = new_token, new_scores
        scores = new_scores
        keep = None
        if any_done:  # finished documents leave the batch: memory, cache and search state shrink
            keep = torch.nonzero(~done).squeeze(1)
            rows, history, scores, doc_ids = rows[keep], history[keep], scores[keep], doc_ids[keep]
            prefix_scores = prefix_scores[keep]
            new_token = new_token[keep]
        if k > 1 or keep is not None:
            state.reorder(rows.reshape(-1), keep)
            for rule in processors:
                rule.reorder(rows.reshape(-1))
        for rule in processors:
            rule.push(new_token.reshape(-1))
        inputs = new_token.reshape(-1)
    return pool.hypotheses(n_best)


def _fallback(pool: _Pool, doc_ids: Tensor, done: Tensor, scores: Tensor, history: Tensor, prefix_scores: Tensor,
              t: int, alpha: float, blocker: NgramBlocker | None) -> None:
    """A document that ends with nothing finished (every continuation of every beam was blocked: only
    possible when no piece continues a word) returns its best open beam as it was before this step,
    without its open last word when blocking (its complete words repeat no n-gram; the open one may),
    marked unfinished. Rare, so a loop over those documents."""
    empty = done & (pool.score[doc_ids, 0] == float("-inf")) & torch.isfinite(scores[:, 0])
    for i in torch.nonzero(empty).flatten().tolist():
        tokens = history[i, 0, :t]
        keep = t
        if blocker is not None and t > 0:
            starts = torch.nonzero(blocker.word_start[tokens]).flatten()
            keep = int(starts[-1]) if len(starts) else 0
        log_prob = prefix_scores[i, :1, keep - 1] if keep else scores.new_zeros(1)
        pool.add(doc_ids[i:i + 1], (log_prob / gnmt_penalty(keep, alpha))[None], log_prob[None],
                 torch.full((1, 1), keep, dtype=torch.long, device=scores.device), history[i:i + 1, :1],
                 torch.zeros(1, 1, dtype=torch.bool, device=scores.device))


def greedy(model, docs: PackedDocuments, gen: GenerationConfig, word_start: Tensor | None = None) -> list[Hypothesis]:
    """Greedy decoding: literally the beam search with one beam."""
    return generate(model, docs, gen.model_copy(update={"beam_size": 1}), word_start)
