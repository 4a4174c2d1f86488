"""Extractive oracle labels: which sentences of a document best match its reference summary.

Score of a candidate set = ROUGE-1 F + ROUGE-2 F of the candidate summary against the reference, exactly as
`rouge_score.RougeScorer(["rouge1", "rouge2"], use_stemmer=True)` scores it, where the candidate summary is
the selected sentences in document order joined by spaces (what an extractive summarizer outputs) and the
reference is the summary sentences joined by spaces. Counts are multisets (true ROUGE), not the n-gram
sets of PreSumm's approximation, and bigrams across adjacent selected sentences count as they do when
rouge-score reads the joined text.

Speed comes from tokenizing and stemming each sentence once (memoized stems), keeping per-sentence n-gram
counts over the reference's n-grams only, and scoring all candidates of a step at once with numpy; the
floating-point formula is rouge-score's, evaluated in the same order, so scores are bit-identical and the
greedy choice (first best, strictly improving) is the one `oracle_reference.greedy_rouge_score` makes.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np

_VALID = re.compile(r"^[a-z0-9]+$")


# rouge-score lower-cases, then replaces every run of characters outside [a-z0-9] by a space. After
# lower-casing, ASCII-encoding with "?" for anything else and mapping every byte outside [a-z0-9] (and the
# text separator \n) to a space does the same at C speed.
_KEEP = set(b"abcdefghijklmnopqrstuvwxyz0123456789\n")
_CLEAN = bytes(c if c in _KEEP else 32 for c in range(256))


class RougeTokenizer:
    """rouge_score.tokenize.tokenize(text, PorterStemmer()) with stems memoized, mapped to int ids."""

    max_cache = 2_000_000

    def __init__(self) -> None:
        from nltk.stem import porter

        self._stem = porter.PorterStemmer().stem  # what rouge_score.tokenizers.DefaultTokenizer uses
        self._ids: dict[bytes, int] = {}    # raw lower-case token -> id of its stem (-1: dropped)
        self._stem_ids: dict[str, int] = {}
        self._dropped = False               # some token stems to nothing valid

    def _add(self, raw: bytes) -> int:
        word = raw.decode("ascii")
        stem = self._stem(word) if len(word) > 3 else word
        i = self._stem_ids.setdefault(stem, len(self._stem_ids)) if _VALID.match(stem) else -1
        self._dropped |= i < 0
        self._ids[raw] = i
        return i

    def ids(self, text: str) -> list[int]:
        flat, _ = self.ids_flat([text])
        return flat

    def ids_flat(self, texts: list[str]) -> tuple[list[int], list[int]]:
        """Token ids of all texts concatenated, and each text's token count. The texts are cleaned in one
        pass, newline-joined (rouge-score splits at a newline anyway; a text holding one is
        whitespace-normalized first so it stays one text)."""
        if not texts:
            return [], []
        if len(self._ids) > self.max_cache:  # bound memory on huge corpora; ids only matter within one call
            self._ids.clear()
            self._stem_ids.clear()
        joined = "\n".join(texts)
        if joined.count("\n") != len(texts) - 1:
            joined = "\n".join(" ".join(t.split()) for t in texts)
        clean = joined.lower().encode("ascii", "replace").translate(_CLEAN)
        lines = [line.split() for line in clean.split(b"\n")]
        words = list(itertools.chain.from_iterable(lines))
        try:
            ids = list(map(self._ids.__getitem__, words))
        except KeyError:
            ids = [self._ids.get(w) for w in words]
            ids = [self._add(w) if i is None else i for w, i in zip(words, ids)]
        lens = list(map(len, lines))
        if self._dropped:  # a stem outside [a-z0-9]+ is dropped, as rouge-score does (never seen in practice)
            keep, k = [], 0
            for j, n in enumerate(lens):
                part = [i for i in ids[k:k + n] if i >= 0]
                keep += part
                k, lens[j] = k + n, len(part)
            ids = keep
        return ids, lens

    def __len__(self) -> int:
        return len(self._stem_ids)


_SHARED: RougeTokenizer | None = None


def shared_tokenizer() -> RougeTokenizer:
    global _SHARED
    if _SHARED is None:
        _SHARED = RougeTokenizer()
    return _SHARED


def _f(overlap: np.ndarray, pred: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """rouge_score's F: p = o / max(pred, 1); r = o / max(ref, 1); f = 2*p*r/(p+r), or 0 when p+r = 0.
    Same operations in the same order, so the same doubles."""
    p = overlap / np.maximum(pred, 1)
    r = overlap / np.maximum(ref, 1)
    s = p + r
    zero = s <= 0                           # p, r >= 0: only both-zero sums, set to 1 to divide safely
    f = 2 * p * r / np.where(zero, 1.0, s)
    f[zero] = 0.0
    return f


@dataclass
class _State:
    chosen: tuple[int, ...]       # sorted sentence indices
    c1: np.ndarray                # counts of the reference's unigrams in the candidate text
    c2: np.ndarray                # same for bigrams
    length: int                   # candidate tokens
    score: float


def _lookup(table: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Position of each code in the sorted `table`, -1 when absent."""
    if not len(table):
        return np.full(codes.shape, -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(table, codes), len(table) - 1)
    return np.where(table[pos] == codes, pos, -1)


class OracleProblem:
    """One document against one reference, ready to score sentence sets fast."""

    def __init__(self, flat: np.ndarray, lens: np.ndarray, reference: np.ndarray, vocab: int):
        """flat: the document's token ids, sentence after sentence; lens: tokens per sentence;
        reference: the summary's token ids; vocab: an upper bound of the ids."""
        self.n = n = len(lens)
        self.lens = lens = np.asarray(lens, dtype=np.int64)
        self.ref1 = len(reference)
        self.ref2 = max(len(reference) - 1, 0)
        self._ref = np.array([self.ref1, self.ref2], dtype=np.int64)
        v = np.int64(vocab + 1)
        ref = np.asarray(reference, dtype=np.int64)
        flat = np.asarray(flat, dtype=np.int64)
        self.u_ids, r1 = np.unique(ref, return_counts=True)
        self.b_ids, r2 = np.unique(ref[:-1] * v + ref[1:], return_counts=True)
        self.r1, self.r2 = r1.astype(np.int64), r2.astype(np.int64)
        sid = np.repeat(np.arange(n), lens)
        self.m1 = self._counts(flat, sid, self.u_ids)
        same = sid[:-1] == sid[1:]
        self.m2 = self._counts((flat[:-1] * v + flat[1:])[same], sid[:-1][same], self.b_ids)
        self.candidates = np.flatnonzero(lens > 0)
        # Reference-bigram column of the boundary bigram (last token of i, first token of j), for every
        # pair of non-empty sentences: what joining i and j adds to the candidate text (-1: not in the reference).
        c = self.candidates
        ends = np.cumsum(lens)
        self.boundary = np.full((n + 1, n + 1), -1, dtype=np.int64)   # row/col n = "no neighbour"
        if len(c) and len(self.b_ids):
            last, first = flat[ends[c] - 1], flat[ends[c] - lens[c]]
            self.boundary[np.ix_(c, c)] = _lookup(self.b_ids, last[:, None] * v + first[None, :])

    def _counts(self, grams: np.ndarray, rows: np.ndarray, table: np.ndarray) -> np.ndarray:
        """[n, len(table)] count of each table n-gram per sentence."""
        if not (len(table) and len(grams)):
            return np.zeros((self.n, len(table)), dtype=np.int64)
        pos = _lookup(table, grams)
        hit = pos >= 0
        flat = np.bincount(rows[hit] * len(table) + pos[hit], minlength=self.n * len(table))
        return flat.reshape(self.n, len(table))

    def empty(self) -> _State:
        return _State((), np.zeros(len(self.r1), np.int64), np.zeros(len(self.r2), np.int64), 0, 0.0)

    def expand(self, st: _State) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(candidates, their scores, their bigram count rows) for adding one sentence to `st`."""
        cand = self.candidates
        if st.chosen:
            chosen = np.asarray(st.chosen, dtype=np.int64)
            free = np.ones(self.n, dtype=bool)
            free[chosen] = False
            cand = cand[free[cand]]
        if not len(cand):
            return cand, np.zeros(0), np.zeros((0, len(self.r2)), np.int64)
        o1 = np.minimum(st.c1 + self.m1[cand], self.r1).sum(axis=1)
        x2 = st.c2 + self.m2[cand]
        if st.chosen and len(self.r2):
            # neighbours p < c < q in the chosen set (document order): p-q no longer touch, p-c and c-q do
            k = np.searchsorted(chosen, cand)
            p = np.where(k > 0, chosen[np.maximum(k - 1, 0)], self.n)
            q = np.where(k < len(chosen), chosen[np.minimum(k, len(chosen) - 1)], self.n)
            rows = np.arange(len(cand))
            # one column per row in each term, so plain fancy-index updates (no np.add.at) are exact
            for cols, sign in ((self.boundary[p, q], -1), (self.boundary[p, cand], 1), (self.boundary[cand, q], 1)):
                ok = cols >= 0
                x2[rows[ok], cols[ok]] += sign
        overlap = np.empty((2, len(cand)), dtype=np.int64)
        overlap[0] = o1
        np.minimum(x2, self.r2).sum(axis=1, out=overlap[1])
        pred = np.empty((2, len(cand)), dtype=np.int64)
        pred[0] = st.length + self.lens[cand]
        pred[1] = pred[0] - 1
        f = _f(overlap, pred, self._ref[:, None])
        return cand, f[0] + f[1], x2

    def add(self, st: _State, c: int, score: float, c2: np.ndarray) -> _State:
        chosen = tuple(sorted((*st.chosen, int(c))))
        return _State(chosen, st.c1 + self.m1[c], c2, st.length + int(self.lens[c]), float(score))

    def greedy(self, max_sentences: int) -> tuple[int, ...]:
        st = self.empty()
        for _ in range(max_sentences):
            cand, score, x2 = self.expand(st)
            if not len(cand):
                break
            j = int(np.argmax(score))               # first best, like a strict `>` scan in index order
            if not score[j] > st.score:
                break
            st = self.add(st, cand[j], score[j], x2[j])
        return st.chosen

    def beam(self, max_sentences: int, beam_size: int) -> tuple[int, ...]:
        """Best set over a beam of `beam_size` partial sets per size (exhaustive when the beam is wide)."""
        beam, best = [self.empty()], self.empty()
        for _ in range(max_sentences):
            pool: dict[tuple[int, ...], tuple[float, _State, int, np.ndarray]] = {}
            for st in beam:
                cand, score, x2 = self.expand(st)
                for j in range(len(cand)):
                    key = tuple(sorted((*st.chosen, int(cand[j]))))
                    if key not in pool:
                        pool[key] = (float(score[j]), st, int(cand[j]), x2[j])
            if not pool:
                break
            top = sorted(pool.items(), key=lambda kv: (-kv[1][0], kv[0]))[:beam_size]
            beam = [self.add(st, c, s, x2) for _, (s, st, c, x2) in top]
            if beam[0].score > best.score:
                best = beam[0]
        return best.chosen


def oracle_labels(sentences: list[str], summary: list[str], max_sentences: int = 3, method: str = "greedy",
                  beam_size: int = 5, tokenizer: RougeTokenizer | None = None) -> np.ndarray:
    """0/1 per sentence: the oracle's extractive summary of `sentences` for reference `summary`."""
    tok = tokenizer if tokenizer is not None else shared_tokenizer()
    flat, lens = tok.ids_flat([*sentences, *summary])
    n_doc = sum(lens[:len(sentences)])
    ids = np.array(flat, dtype=np.int64)
    problem = OracleProblem(ids[:n_doc], np.array(lens[:len(sentences)]), ids[n_doc:], len(tok))
    chosen = problem.greedy(max_sentences) if method == "greedy" else problem.beam(max_sentences, beam_size)
    labels = np.zeros(len(sentences), dtype=np.uint8)
    labels[list(chosen)] = 1
    return labels
