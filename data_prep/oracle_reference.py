"""Slow references for the oracle (tests and benchmarks/bench_oracle.py): what `oracle.py` must equal or beat.

- `greedy_rouge_score`: the naive greedy that re-scores every candidate set with rouge-score.
- `exhaustive_rouge_score`: every set of up to k sentences scored with rouge-score (the true optimum).
- `greedy_presumm`: PreSumm's greedy_selection (Liu & Lapata 2019, src/prepro/data_builder.py): per-sentence
  n-gram SETS, no stemming, union of sets — fast but not ROUGE.
"""
from __future__ import annotations

import itertools
import re
from functools import lru_cache


@lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer  # lazy: ~1.1 s (nltk), which greedy_presumm never needs

    return rouge_scorer.RougeScorer(["rouge1", "rouge2"], use_stemmer=True)


def rouge_12(reference: list[str], chosen: list[str]) -> float:
    """ROUGE-1 F + ROUGE-2 F of the chosen sentences (joined by spaces) against the reference."""
    s = _scorer().score(" ".join(reference), " ".join(chosen))
    return s["rouge1"].fmeasure + s["rouge2"].fmeasure


def set_score(sentences: list[str], summary: list[str], chosen: tuple[int, ...] | list[int]) -> float:
    return rouge_12(summary, [sentences[i] for i in sorted(chosen)])


def greedy_rouge_score(sentences: list[str], summary: list[str], max_sentences: int = 3) -> list[int]:
    selected: list[int] = []
    best = 0.0
    for _ in range(max_sentences):
        cur_best, cur = best, -1
        for i in range(len(sentences)):
            if i in selected:
                continue
            score = set_score(sentences, summary, selected + [i])
            if score > cur_best:
                cur_best, cur = score, i
        if cur == -1:
            break
        selected.append(cur)
        best = cur_best
    return sorted(selected)


def exhaustive_rouge_score(sentences: list[str], summary: list[str], max_sentences: int = 3
                           ) -> tuple[tuple[int, ...], float]:
    best: tuple[tuple[int, ...], float] = ((), 0.0)
    for k in range(1, max_sentences + 1):
        for combo in itertools.combinations(range(len(sentences)), k):
            s = set_score(sentences, summary, combo)
            if s > best[1]:
                best = (combo, s)
    return best


def _presumm_clean(s: str) -> str:
    return re.sub(r"[^a-zA-Z0-9 ]", "", s)


def _ngrams(n: int, words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def _cal_rouge(evaluated: set, reference: set) -> float:
    overlap = len(evaluated & reference)
    p = overlap / len(evaluated) if evaluated else 0.0
    r = overlap / len(reference) if reference else 0.0
    return 2.0 * ((p * r) / (p + r + 1e-8))


def greedy_presumm(sentences: list[str], summary: list[str], max_sentences: int = 3) -> list[int]:
    abstract = _presumm_clean(" ".join(summary).lower()).split()
    sents = [_presumm_clean(s.lower()).split() for s in sentences]
    ev1 = [_ngrams(1, s) for s in sents]
    ev2 = [_ngrams(2, s) for s in sents]
    ref1, ref2 = _ngrams(1, abstract), _ngrams(2, abstract)
    selected: list[int] = []
    best = 0.0
    for _ in range(max_sentences):
        cur_best, cur = best, -1
        for i in range(len(sents)):
            if i in selected:
                continue
            c = selected + [i]
            score = (_cal_rouge(set.union(*[ev1[j] for j in c]), ref1)
                     + _cal_rouge(set.union(*[ev2[j] for j in c]), ref2))
            if score > cur_best:
                cur_best, cur = score, i
        if cur == -1:
            break
        selected.append(cur)
        best = cur_best
    return sorted(selected)
