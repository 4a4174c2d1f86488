"""Batched beam search (and greedy = beam 1) for `HibertAbstractive`.

B documents x K beams decode together. The encoder runs once; every decoder layer's memory K/V is
projected once per document and never tiled over beams (beams are the query axis of cross-attention);
the self-attention K/V live in a preallocated cache written in place and reordered by backpointers.
Per step the Python work is a fixed number of tensor ops whatever B and K are; finished hypotheses go to
a per-document pool (tensors, merged with one sort), and documents that are done leave the batch.

Rules, all in subwords:
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
from hibert.tokens import BOS_ID, EOS_ID, MASK_ID, PAD_ID, UNK_ID
from modeling.packing import PackedDocuments

NEVER_GENERATED = (PAD_ID, UNK_ID, BOS_ID, MASK_ID)  # <unk> renders as ' ⁇ ', never a summary


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


class NgramBlocker:
    """Word-level no-repeat-n-gram blocking for R hypotheses, as tensors.

    Words: a word-start piece (`word_start[v]`, True for SentencePiece pieces beginning with '▁' and for
    special pieces) followed by the continuation pieces after it; the first piece of a hypothesis starts a
    word whatever it is. The last word of a prefix is *open*: it is complete only once the next token is a
    word-start piece or EOS. Rule: a candidate is banned iff it completes a word n-gram that already
    occurred as n consecutive complete words earlier in the hypothesis:
      * a word-start piece or EOS completes the open word: banned iff the n words ending with the open
        word repeat an earlier n-gram. Continuation pieces extend the open word (into another word) and
        are never banned at this point, so per hypothesis the banned set is empty or all word-start
        pieces + EOS (`banned()` says which).
      * at the last free step (the next token is the forced EOS) the candidate's own word completes too:
        a word-start piece c is also banned iff (..., open word, c) repeats, a continuation piece c iff
        (..., open word + c) repeats (`banned_mask(final=True)`), so no beam walks into a dead end.
    Both reduce to: which words have followed the current (n-1)-word context (`_followers`).

    Words are compared by a 62-bit key (two polynomial hashes mod primes below 2^31, exact integer
    arithmetic in int64): distinct words collide with probability ~2^-62 per comparison."""

    P1, P2, M1, M2 = 2_147_483_647, 2_147_483_629, 1_000_003, 1_000_033

    def __init__(self, n: int, word_start: Tensor, rows: int, max_words: int):
        device = word_start.device
        self.n, self.max_words, self.steps = n, max_words, 0
        self.word_start = word_start.to(torch.bool)
        self.completes = self.word_start.clone()
        self.completes[EOS_ID] = True
        self.words = torch.zeros(rows, max_words + 1, dtype=torch.long, device=device)  # keys of complete words
        self.count = torch.zeros(rows, dtype=torch.long, device=device)                # complete words
        self.h1 = torch.zeros(rows, dtype=torch.long, device=device)                   # the open word's hashes
        self.h2 = torch.zeros(rows, dtype=torch.long, device=device)
        self.open = torch.zeros(rows, dtype=torch.bool, device=device)

    def _open_key(self) -> Tensor:
        return self.h1 * 2**31 + self.h2

    def _followers(self, words: Tensor, length: Tensor) -> tuple[Tensor, Tensor]:
        """Keys [R, J] of the words that followed an earlier occurrence of the last n-1 words of
        `words[:, :length]`, and which of the J are real matches."""
        n, width = self.n, words.shape[1]
        if width < n:
            return words[:, :0], torch.zeros_like(words[:, :0], dtype=torch.bool)
        back = (length[:, None] + torch.arange(1 - n, 0, device=words.device)).clamp(0, width - 1)
        context = words.gather(1, back)                                               # [R, n-1]
        windows = words.unfold(1, n, 1)                                               # [R, width-n+1, n]
        ends = torch.arange(n - 1, width, device=words.device)
        ok = (windows[..., :-1] == context[:, None, :]).all(-1) & (ends[None, :] < length[:, None])
        return windows[..., -1], ok & (length >= n - 1)[:, None]

    def banned(self) -> Tensor:
        """[R] bool: True = every word-start piece and EOS is banned for this hypothesis now."""
        keys, ok = self._followers(self.words[:, : min(self.steps, self.max_words)], self.count)
        return (ok & (keys == self._open_key()[:, None])).any(-1) & self.open

    def banned_mask(self, final: bool = False) -> Tensor:
        """[R, V] bool: the banned candidates (`final`: the step before the forced EOS). The final step
        finds the banned pieces from the few matching followers by inverting the word hash (the hash of
        a one-piece word, or of the open word extended by one piece, determines the piece), so it never
        builds [R, V] keys."""
        mask = self.banned()[:, None] & self.completes[None, :]
        if not final or self.steps == 0:
            return mask
        rows, vocab, low = torch.arange(self.open.shape[0], device=mask.device), mask.shape[1], 2**31 - 1
        width = min(self.steps, self.max_words)
        closed = self.words[:, : width + 1].clone()  # the open word as if complete
        closed[rows, self.count] = torch.where(self.open, self._open_key(), closed[rows, self.count])
        # word-start piece c: the one-piece word (c,) follows the context ending with the open word
        keys, ok = self._followers(closed, self.count + self.open)
        new_word = (keys >> 31) - 1
        ok &= ((keys & low) - 1 == new_word) & (new_word >= 0) & (new_word < vocab)
        new_word = new_word.clamp(0, vocab - 1)
        ok &= self.word_start[new_word] | ~self.open[:, None]
        # continuation piece c: the open word + c follows the context of complete words before it
        keys, ok2 = self._followers(self.words[:, :width], self.count)
        longer = (keys >> 31) - self.h1[:, None] * self.M1 % self.P1
        longer = longer % self.P1 - 1
        ok2 &= (longer >= 0) & (longer < vocab) & self.open[:, None]
        longer = longer.clamp(0, vocab - 1)
        ok2 &= ((self.h2[:, None] * self.M2 + longer + 1) % self.P2 == keys & low) & ~self.word_start[longer]
        extra = torch.zeros(mask.shape[0], vocab + 1, dtype=torch.bool, device=mask.device)
        extra.scatter_(1, torch.where(ok, new_word, vocab), True)
        extra.scatter_(1, torch.where(ok2, longer, vocab), True)
        extra[:, EOS_ID] = False  # EOS completes only the open word: the rule above
        return mask | extra[:, :vocab]

    def push(self, tokens: Tensor) -> None:
        """Append one token to every hypothesis (after `reorder`)."""
        start = self.word_start[tokens] | ~self.open
        close = start & self.open
        at = self.count.clamp(max=self.max_words)[:, None]
        self.words.scatter_(1, at, torch.where(close[:, None], self._open_key()[:, None], self.words.gather(1, at)))
        self.count += close
        t = tokens + 1
        self.h1 = torch.where(start, t, (self.h1 * self.M1 + t) % self.P1)
        self.h2 = torch.where(start, t, (self.h2 * self.M2 + t) % self.P2)
        self.open = torch.ones_like(self.open)
        self.steps += 1

    def reorder(self, rows: Tensor) -> None:
        self.words, self.count = self.words.index_select(0, rows), self.count.index_select(0, rows)
        self.h1, self.h2, self.open = (x.index_select(0, rows) for x in (self.h1, self.h2, self.open))


class WordPieceCap:
    """At most `limit` pieces per word: once a hypothesis's open word has `limit` pieces, continuation
    pieces are banned for it (it must start a word or end), unless the n-gram blocker already bans every
    completion there (then the word goes on: the cap never makes a dead end). Word n-gram blocking cannot
    see inside a word: an undertrained decoder meets min_length by stacking continuation pieces
    ("he's's's's"), and the cap is what stops that."""

    def __init__(self, limit: int, completes: Tensor, rows: int):
        self.limit = limit
        self.continuation = ~completes.to(torch.bool)                       # [V]: pieces that extend a word
        self.pieces = torch.zeros(rows, dtype=torch.long, device=completes.device)  # pieces of the open word

    def apply(self, logp: Tensor, blocked: Tensor | None) -> None:
        """-inf to continuation pieces of the capped hypotheses, in place (`blocked [R]`: the n-gram
        blocker bans every completion of that row, so the cap yields)."""
        capped = self.pieces >= self.limit
        if blocked is not None:
            capped &= ~blocked
        if logp.is_cuda:  # a mask pass costs nothing there, a host sync (nonzero) would
            logp.masked_fill_(capped[:, None] & self.continuation[None, :], float("-inf"))
        else:
            rows = torch.nonzero(capped).squeeze(1)
            if len(rows):
                logp[rows] = logp[rows].masked_fill(self.continuation, float("-inf"))

    def push(self, tokens: Tensor) -> None:
        self.pieces = torch.where(self.continuation[tokens] & (self.pieces > 0), self.pieces + 1, 1)

    def reorder(self, rows: Tensor) -> None:
        self.pieces = self.pieces.index_select(0, rows)


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


def _top_candidates(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k best of each row, best first, equal scores by lower index (topk's own tie order is
    unspecified): re-sorted by index, then stably by score."""
    top, index = scores.topk(k, dim=1)
    index, perm = index.sort(dim=1)
    top, perm2 = top.gather(1, perm).sort(dim=1, descending=True, stable=True)
    return top, index.gather(1, perm2)


def _step_bias(vocab: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Additive log-prob masks: (before min_length, normal, at max_length)."""
    normal = torch.zeros(vocab, device=device)
    normal[list(NEVER_GENERATED)] = float("-inf")
    early = normal.clone()
    early[EOS_ID] = float("-inf")
    last = torch.full((vocab,), float("-inf"), device=device)
    last[EOS_ID] = 0.0
    return early, normal, last


@torch.no_grad()
def generate(model, docs: PackedDocuments, gen: GenerationConfig, word_start: Tensor | None = None,
             n_best: int = 1, use_cache: bool = True,
             trace: Callable[[int, Tensor, Tensor], None] | None = None) -> list[Hypothesis]:
    """Beam search over every document of `docs` (packed layout, on the model's device) with a
    `HibertAbstractive` in eval mode (callers wrap it in autocast for bf16). `word_start [V]` bool marks
    the pieces that begin a word (needed when gen.no_repeat_ngram or gen.max_word_pieces > 0). Returns one `Hypothesis` per
    document, in order, with its `n_best` best in `.nbest`. `use_cache=False` recomputes the whole prefix
    at every step instead of using the self-attention cache (benchmarks). `trace(step, prefixes [R, t],
    banned [R, V])` sees the n-gram blocker's decision at every step (tests)."""
    k, max_len, alpha = gen.beam_size, gen.max_length, gen.length_penalty
    if not 1 <= n_best <= k:
        raise ValueError(f"n_best ({n_best}) must be between 1 and beam_size ({k})")
    if (gen.no_repeat_ngram or gen.max_word_pieces) and word_start is None:
        raise ValueError("generation.no_repeat_ngram / max_word_pieces > 0 need word_start (which pieces begin a "
                         "word)")
    vocab = model.cfg.vocab_size
    device = docs.tokens.device
    num_docs = docs.num_docs
    state = model.start_decoding(docs, k, max_len + 1)
    doc_ids = torch.arange(num_docs, device=device)                # original index of each open document
    scores = torch.full((num_docs, k), float("-inf"), device=device)
    scores[:, 0] = 0.0                                              # one live beam to start from
    history = torch.zeros(num_docs, k, max_len, dtype=torch.long, device=device)
    prefix_scores = torch.zeros(num_docs, k, max_len, device=device)  # log p of each prefix (for `_fallback`)
    blocker = None
    if gen.no_repeat_ngram:
        blocker = NgramBlocker(gen.no_repeat_ngram, word_start.to(device), num_docs * k, max_len + 1)
    cap = None
    if gen.max_word_pieces:
        completes = word_start.to(device=device, dtype=torch.bool).clone()
        completes[EOS_ID] = True
        cap = WordPieceCap(gen.max_word_pieces, completes, num_docs * k)
    pool = _Pool(num_docs, k, max_len, device)
    early, normal, last = _step_bias(vocab, device)
    bound_penalty = gnmt_penalty(max_len + 1, alpha)
    inputs = torch.full((num_docs * k,), BOS_ID, dtype=torch.long, device=device)
    rank = torch.arange(2 * k, device=device)

    for t in range(max_len + 1):
        b = doc_ids.shape[0]
        if use_cache:
            logp = model.decode_step(inputs, state)
        else:
            bos = torch.full((b * k, 1), BOS_ID, dtype=torch.long, device=device)
            logp = model.decode_prefix(torch.cat([bos, history.view(b * k, max_len)[:, :t]], 1), state.memory)
        logp.add_(early if t < gen.min_length else last if t == max_len else normal)  # in place: a fresh tensor
        if blocker is not None:
            _block_ngrams(logp, blocker, t == max_len - 1,
                          None if trace is None else lambda mask: trace(t, history.view(b * k, max_len)[:, :t], mask))
        if cap is not None and t < max_len:
            cap.apply(logp, None if blocker is None else blocker.banned())
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
            for rule in (blocker, cap):
                if rule is not None:
                    rule.reorder(rows.reshape(-1))
        for rule in (blocker, cap):
            if rule is not None:
                rule.push(new_token.reshape(-1))
        inputs = new_token.reshape(-1)
    return pool.hypotheses(n_best)


def _block_ngrams(logp: Tensor, blocker: NgramBlocker, final: bool, trace: Callable[[Tensor], None] | None) -> None:
    """-inf to the banned candidates, in place. Usually few hypotheses are blocked and the ban is the
    same set for each, so only their rows are touched (no [R, V] mask pass)."""
    if final:
        mask = blocker.banned_mask(final=True)
        logp.masked_fill_(mask, float("-inf"))
    else:
        banned = blocker.banned()
        mask = banned[:, None] & blocker.completes[None, :] if trace is not None or logp.is_cuda else None
        if logp.is_cuda:  # a mask pass costs nothing there, a host sync (nonzero) would
            logp.masked_fill_(mask, float("-inf"))
        else:
            rows = torch.nonzero(banned).squeeze(1)
            logp[rows] = logp[rows].masked_fill(blocker.completes, float("-inf"))
    if trace is not None:
        trace(mask)


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
