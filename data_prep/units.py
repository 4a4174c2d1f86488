"""Units of a cluster (Liu & Lapata 2019's paragraphs) and the ranker's labels.

A unit is a paragraph of one document; a paragraph longer than `max_sentences` sentences is cut into
consecutive windows of at most that many (this also covers corpora whose paragraph breaks are lost). The label
of a unit is its ROUGE-2 recall against the cluster's summary, exactly as rouge-score computes it with Porter
stemming (`RougeScorer(['rouge2'], use_stemmer=True).score(summary, unit).recall`), counted with the oracle's
fast tokenizer."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from hibert.data_prep.oracle import RougeTokenizer


def windows(num_sentences: int, max_sentences: int) -> list[tuple[int, int]]:
    """[start, end) sentence ranges of a paragraph's units."""
    return [(a, min(a + max_sentences, num_sentences)) for a in range(0, num_sentences, max_sentences)]


def _bigrams(ids: np.ndarray) -> Counter:
    return Counter(zip(ids[:-1].tolist(), ids[1:].tolist()))


def rouge2_recall(units: Sequence[str], summary: Sequence[str], tokenizer: RougeTokenizer) -> np.ndarray:
    """ROUGE-2 recall (0..1) of each unit text against the summary (its sentences joined by spaces)."""
    ids, lens = tokenizer.ids_flat([" ".join(summary), *units])
    parts = np.split(ids, np.cumsum(lens)[:-1])
    ref = _bigrams(parts[0])
    total = sum(ref.values())
    if total == 0:
        return np.zeros(len(units), np.float32)
    out = np.empty(len(units), np.float32)
    for k, p in enumerate(parts[1:]):
        got = _bigrams(p)
        out[k] = sum(min(c, got[g]) for g, c in ref.items() if g in got) / total
    return out
