"""What abstractive users look at besides ROUGE: how much of a summary is new with respect to its source
(novel n-gram rates, See et al. 2017 §7.2), how long it is, and how much it repeats itself. N-grams are of the
viewer's tokens (`evaluation.viewer.tokens`: words and punctuation marks apart, lowercased, NFKC-normalised, so a
decoder's "fi" matches a source's ligature and "budget." the source's "budget"); they never cross a sentence
boundary (an extract made of source sentences has no novel n-grams); a summary's n-grams are counted with
repeats, as in the papers' tables. Length (`mean_words`) is in whitespace-separated words."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from hibert.finetune.evaluation.viewer import tokens


def words(text: str) -> list[str]:
    """The tokens n-grams are made of (the same the viewer matches copied spans on)."""
    return [t for t, _, _ in tokens(text)]


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def sentence_ngrams(sentences: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [g for s in sentences for g in ngrams(words(s), n)]


def novel_ngram_rate(summary: Sequence[str], source: Sequence[str], n: int) -> float | None:
    """Share of the summary's n-grams that never occur in the source (None: the summary has none)."""
    summ = sentence_ngrams(summary, n)
    if not summ:
        return None
    src = set(sentence_ngrams(source, n))
    return sum(g not in src for g in summ) / len(summ)


def repetition_rate(summary: Sequence[str], n: int = 3) -> float | None:
    """Share of the summary's n-grams that repeat an earlier n-gram of the same summary."""
    grams = sentence_ngrams(summary, n)
    if not grams:
        return None
    counts = Counter(grams)
    return sum(c - 1 for c in counts.values()) / len(grams)


def abstractiveness(summaries: Sequence[Sequence[str]], sources: Sequence[Sequence[str]]) -> dict[str, float]:
    """Corpus means (x100 for rates) over the documents where each quantity is defined."""
    out: dict[str, float] = {}
    for n in (1, 2, 3, 4):
        rates = [r for s, d in zip(summaries, sources) if (r := novel_ngram_rate(s, d, n)) is not None]
        out[f"novel_{n}gram"] = 100 * float(np.mean(rates)) if rates else 0.0
    reps = [r for s in summaries if (r := repetition_rate(s)) is not None]
    out["repeated_3gram"] = 100 * float(np.mean(reps)) if reps else 0.0
    out["mean_words"] = float(np.mean([len(" ".join(s).split()) for s in summaries])) if summaries else 0.0
    out["mean_sentences"] = float(np.mean([len(s) for s in summaries])) if summaries else 0.0
    return out
