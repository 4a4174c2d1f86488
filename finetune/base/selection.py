"""Turning sentence scores into an extractive summary (HIBERT §4.2: top-k sentences, k tuned on
validation), output in document order, with optional trigram blocking (Paulus et al. 2017; skip a
candidate sharing a trigram with what is already selected)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def trigrams(text: str) -> set[tuple[str, str, str]]:
    w = text.lower().split()
    return {tuple(w[i:i + 3]) for i in range(len(w) - 2)}


def select(scores: Sequence[float] | np.ndarray, sentences: Sequence[str], k: int,
           trigram_blocking: bool = False) -> list[int]:
    """Indices of the chosen sentences, in document order. Ties keep the earlier sentence."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) != len(sentences):
        raise ValueError(f"{len(scores)} scores for {len(sentences)} sentences")
    order = np.argsort(-scores, kind="stable")
    chosen: list[int] = []
    seen: set[tuple[str, str, str]] = set()
    for i in order.tolist():
        if len(chosen) >= k:
            break
        if not sentences[i].strip():
            continue
        if trigram_blocking:
            tri = trigrams(sentences[i])
            if tri & seen:
                continue
            seen |= tri
        chosen.append(i)
    return sorted(chosen)


def lead(sentences: Sequence[str], k: int = 3) -> list[int]:
    """Lead-k: the first k non-empty sentences."""
    return [i for i, s in enumerate(sentences) if s.strip()][:k]


def oracle_from_labels(labels: Sequence[int] | np.ndarray) -> list[int]:
    return [i for i, v in enumerate(np.asarray(labels).tolist()) if v]
