"""Masked-sentence document transformation (HIBERT §3.2, "Document Masking").

Select 15% of a document's sentences (at least one); each selected sentence is, with probability
0.8, replaced by [MASK] tokens of the same length, 0.1 kept as it is, 0.1 replaced by a random sentence
from another document. The decoder then predicts the ORIGINAL selected sentences.

The transformation is a pure function of (seed, epoch, document index) — its RNG is seeded from exactly
those three numbers — so resumed runs and any number of ranks or loader workers see identical masks.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hibert.config.training import ObjectiveConfig
from hibert.tokens import MASK_ID

MASK, KEEP, RANDOM = 0, 1, 2


@dataclass
class MaskedDocument:
    sentences: list[np.ndarray]       # the encoder's input (after the 80/10/10 transformation)
    positions: list[int]              # indices of the selected sentences, ascending
    targets: list[np.ndarray]         # original tokens of the selected sentences (what the decoder predicts)
    actions: list[int]                # MASK / KEEP / RANDOM per selected sentence


def document_rng(seed: int, epoch: int, doc_index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, doc_index])


def num_selected(num_sentences: int, spec: ObjectiveConfig) -> int:
    k = max(spec.min_selected, int(spec.select_ratio * num_sentences + 0.5))
    if spec.max_selected is not None:
        k = min(k, spec.max_selected)
    return max(0, min(k, num_sentences))


def mask_document(sentences: list[np.ndarray], spec: ObjectiveConfig, seed: int, epoch: int, doc_index: int,
                  random_sentence: Callable[[np.random.Generator], np.ndarray]) -> MaskedDocument:
    """Apply the transformation to one document (chunk). `random_sentence(rng)` draws a sentence from
    another document; it is only called for RANDOM actions and must itself be deterministic in rng."""
    rng = document_rng(seed, epoch, doc_index)
    n = len(sentences)
    k = num_selected(n, spec)
    positions = sorted(int(p) for p in rng.choice(n, size=k, replace=False)) if k else []
    draws = rng.random(len(positions))
    out = list(sentences)
    actions: list[int] = []
    for pos, u in zip(positions, draws):
        if u < spec.mask_prob:
            out[pos] = np.full(len(sentences[pos]), MASK_ID, dtype=sentences[pos].dtype)
            actions.append(MASK)
        elif u < spec.mask_prob + spec.keep_prob:
            actions.append(KEEP)
        else:
            out[pos] = np.asarray(random_sentence(rng), dtype=sentences[pos].dtype)
            actions.append(RANDOM)
    return MaskedDocument(out, positions, [sentences[p] for p in positions], actions)


def other_document_sentence(dataset, doc_index: int) -> Callable[[np.random.Generator], np.ndarray]:
    """A `random_sentence` drawing uniformly a document j != doc_index, then one of its sentences."""
    n = len(dataset)

    def draw(rng: np.random.Generator) -> np.ndarray:
        if n < 2:
            raise ValueError("random-sentence replacement needs at least two documents")
        j = int(rng.integers(n - 1))
        j += j >= doc_index
        sents = dataset[j]
        return sents[int(rng.integers(len(sents)))]

    return draw
