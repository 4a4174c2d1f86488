"""Extractive oracle labels: which sentences of a document best match its reference summary.

Score of a candidate set = ROUGE-1 F + ROUGE-2 F of the candidate summary against the reference, exactly as
`rouge_score.RougeScorer(["rouge1", "rouge2"], use_stemmer=True)` scores it, where the candidate summary is
the selected sentences in document order joined by spaces (what an extractive summarizer outputs) and the
reference is the summary sentences joined by spaces. Counts are multisets (true ROUGE), not the n-gram
sets of PreSumm's approximation, and bigrams across adjacent selected sentences count as they do when
rouge-score reads the joined text.

Speed comes from tokenizing and stemming each word once (memoized stems; data_prep/porter.py is an exact,
faster twin of nltk's stemmer), keeping per-sentence n-gram counts over the reference's n-grams only, and
scoring all candidates of a step at once with numpy; the
floating-point formula is rouge-score's, evaluated in the same order, so scores are bit-identical and the
greedy choice (first best, strictly improving) is the one `oracle_reference.greedy_rouge_score` makes.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np

from hibert.data_prep.porter import make_stemmer

_VALID = re.compile(r"^[a-z0-9]+$")


# rouge-score lower-cases, then replaces every run of characters outside [a-z0-9] by a space. After
# lower-casing, ASCII-encoding with "?" for anything else and mapping every byte outside [a-z0-9] to a space
# does the same at C speed. The text separator \n becomes the token "|", which no text can produce.
_KEEP = set(b"abcdefghijklmnopqrstuvwxyz0123456789")
_CLEAN = bytes(c if c in _KEEP else 124 if c == 10 else 32 for c in range(256))
_SEP = b"|"


class RougeTokenizer:
    """rouge_score.tokenize.tokenize(text, PorterStemmer()) with stems memoized, mapped to int ids."""

    max_cache = 2_000_000

    def __init__(self) -> None:
        self._stem = make_stemmer()  # nltk's PorterStemmer().stem (what rouge-score uses), or its exact fast twin
        self._ids: dict[bytes, int] = {_SEP: -2}  # raw lower-case token -> id of its stem (-1: dropped)
        self._stem_ids: dict[str, int] = {}
        self._dropped = False               # some token stems to nothing valid

    def _add(self, raw: bytes) -> None:
        word = raw.decode("ascii")
        stem = self._stem(word) if len(word) > 3 else word
        i = self._stem_ids.setdefault(stem, len(self._stem_ids)) if _VALID.match(stem) else -1
        self._dropped |= i < 0
        self._ids[raw] = i

    def ids_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of all texts concatenated, and each text's token count. The texts are cleaned in one
        pass, joined by a separator token (rouge-score splits at a newline anyway; a text holding one is
        whitespace-normalized first so it stays one text)."""
        if not texts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if len(self._ids) > self.max_cache:  # bound memory on huge corpora; ids only matter within one call
            self._ids = {_SEP: -2}
            self._stem_ids.clear()
        joined = "\n".join(texts)
        if joined.count("\n") != len(texts) - 1:
            joined = "\n".join(" ".join(t.split()) for t in texts)
        words = joined.lower().encode("ascii", "replace").translate(_CLEAN).replace(_SEP, b" | ").split()
        ids = list(map(self._ids.get, words))
        if None in ids:     # new words: stem each once
            for w in {w for w, i in zip(words, ids) if i is None}:
                self._add(w)
            ids = list(map(self._ids.__getitem__, words))
        arr = np.array(ids, dtype=np.int64)
        sep = np.flatnonzero(arr == -2)
        ends = np.append(sep, len(arr))
        lens = ends - np.concatenate(([0], sep + 1))
        arr = np.delete(arr, sep)
        if self._dropped and (arr == -1).any():
            # a stem outside [a-z0-9]+ is dropped, as rouge-score does (never seen in practice)
            sid = np.repeat(np.arange(len(lens)), lens)
            keep = arr >= 0
            lens = np.bincount(sid[keep], minlength=len(lens))
            arr = arr[keep]
        return arr, lens

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
    return 2 * p * r / np.where(s > 0, s, 1.0)   # p, r >= 0, so s = 0 means p = r = 0 and f = 0 / 1 = 0


@dataclass
class _State:
    chosen: tuple[int, ...]       # sorted sentence indices
    counts: np.ndarray            # the candidate text's count of each column (see OracleProblem)
    length: int                   # candidate tokens
    score: float


class OracleProblem:
    """One document against one reference, ready to score sentence sets fast.

    Columns: 0 for tokens outside the reference, 1..U for the reference's distinct unigrams, then its B
    distinct bigrams, then one trash column that absorbs every bigram outside the reference (so updates need
    no masks); columns 0 and trash have reference count 0 and are left out of the overlap. `counts[i, k]` is how
    often sentence i holds column k's n-gram; a candidate text's overlap is min(its counts, reference counts)
    summed over the unigram and the bigram columns."""

    def __init__(self, flat: np.ndarray, lens: np.ndarray, reference: np.ndarray):
        """flat: the document's token ids, sentence after sentence; lens: tokens per sentence;
        reference: the summary's token ids."""
        self.n = n = len(lens)
        self.lens = lens = np.asarray(lens, dtype=np.int64)
        flat = np.asarray(flat, dtype=np.int64)
        ref = np.asarray(reference, dtype=np.int64)
        # unigram column of each token: 1..U for the reference's distinct unigrams, 0 for any other token
        uni = np.unique(ref)
        U, V = len(uni), len(uni) + 1
        ref_col = np.searchsorted(uni, ref) + 1
        col = np.searchsorted(uni, flat)
        col = np.where(np.append(uni, -1)[col] == flat, col + 1, 0)
        # bigram columns U+1..U+B for the reference's distinct bigrams (of unigram columns a, b: code a*V + b)
        r2 = np.bincount(ref_col[:-1] * V + ref_col[1:], minlength=V * V)
        big = np.flatnonzero(r2)
        B = len(big)
        self.width = W = V + B + 1
        self.trash = W - 1
        self.ref_counts = np.concatenate([np.bincount(ref_col, minlength=V), r2[big], [0]])
        self._ref = np.array([len(ref), max(len(ref) - 1, 0)], dtype=np.int64)
        self.selector = np.zeros((W, 2), dtype=np.int64)   # overlap = min(counts, ref_counts) @ selector
        self.selector[1:V, 0] = 1
        self.selector[V:W - 1, 1] = 1
        pair_col = np.full(V * V + 1, self.trash, dtype=np.int64)   # code V*V: "crosses a sentence end"
        pair_col[big] = V + np.arange(B)
        sid = np.repeat(np.arange(n), lens)
        codes = np.where(sid[:-1] == sid[1:], col[:-1] * V + col[1:], V * V)
        cells = np.concatenate([sid * W + col, sid[:-1] * W + pair_col[codes]])
        self.counts = np.bincount(cells, minlength=n * W).reshape(n, W)
        self.candidates = np.flatnonzero(lens > 0)
        # Column of the boundary bigram (last token of i, first token of j) for every pair of sentences: what
        # joining i and j adds to the candidate text. Row/column n = "no neighbour"; empty sentences have none
        # (unigram column 0 pairs with nothing in the reference).
        edge = np.zeros((2, n + 1), dtype=np.int64)
        if len(flat):
            ends = np.cumsum(lens)
            at = np.minimum([ends - 1, ends - lens], len(flat) - 1)   # clipped: empty sentences are masked
            edge[:, :n] = np.where(lens > 0, col[at], 0)
        # looked up per candidate (`_boundary`), never as an [n+1, n+1] table: 8,000 sentences would take 1 GB
        self._pair_col, self._vocab, self._last, self._first = pair_col, V, edge[0], edge[1]
        # sentences whose last token starts, or whose first token ends, a reference bigram with some sentence
        a, b = big // V, big % V
        hot = np.isin(edge[0, :n], a[np.isin(b, edge[1, :n])]) | np.isin(edge[1, :n], b[np.isin(a, edge[0, :n])])
        self._hot = set(np.flatnonzero(hot).tolist())

    def _boundary(self, p: np.ndarray, q: np.ndarray) -> np.ndarray:
        """Column of the boundary bigram (last token of p, first token of q); p or q = n: none."""
        return self._pair_col[self._last[p] * self._vocab + self._first[q]]

    def empty(self) -> _State:
        return _State((), np.zeros(self.width, np.int64), 0, 0.0)

    def expand(self, st: _State) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(candidates, their scores, their count rows) for adding one sentence to `st`."""
        cand = self.candidates
        if st.chosen:
            chosen = np.asarray(st.chosen, dtype=np.int64)
            free = np.ones(self.n, dtype=bool)
            free[chosen] = False
            cand = cand[free[cand]]
        if not len(cand):
            return cand, np.zeros(0), np.zeros((0, self.width), np.int64)
        x = st.counts + self.counts[cand]
        if not self._hot.isdisjoint(st.chosen):
            # neighbours p < c < q in the chosen set (document order; n: none): p-q no longer touch, p-c and
            # c-q do. Each update hits one cell per row, so plain fancy-index updates are exact. Skipped when
            # no chosen sentence has a boundary bigram in the reference (then every update lands in trash).
            around = np.concatenate(([self.n], chosen, [self.n]))
            k = np.searchsorted(chosen, cand)
            p, q = around[k], around[k + 1]
            flat, at = x.reshape(-1), np.arange(0, len(cand) * self.width, self.width)
            flat[at + self._boundary(p, q)] -= 1
            flat[at + self._boundary(p, cand)] += 1
            flat[at + self._boundary(cand, q)] += 1
        overlap = np.minimum(x, self.ref_counts) @ self.selector      # [k, 2]: unigram, bigram overlap
        pred = np.empty((len(cand), 2), dtype=np.int64)
        pred[:, 0] = st.length + self.lens[cand]
        pred[:, 1] = pred[:, 0] - 1
        f = _f(overlap, pred, self._ref)
        return cand, f[:, 0] + f[:, 1], x

    def add(self, st: _State, c: int, score: float, counts: np.ndarray) -> _State:
        chosen = tuple(sorted((*st.chosen, int(c))))
        return _State(chosen, counts, st.length + int(self.lens[c]), float(score))

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
    ids, lens = tok.ids_flat([*sentences, *summary])
    n_doc = int(lens[:len(sentences)].sum())
    problem = OracleProblem(ids[:n_doc], lens[:len(sentences)], ids[n_doc:])
    chosen = problem.greedy(max_sentences) if method == "greedy" else problem.beam(max_sentences, beam_size)
    labels = np.zeros(len(sentences), dtype=np.uint8)
    labels[list(chosen)] = 1
    return labels
