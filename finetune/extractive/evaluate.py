"""Evaluating extractive selections: sentence scores of each chunk joined per document, top-k selection (k
and trigram blocking tuned on validation), scored next to Lead-3 and the oracle."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from finetune.base.report import Document, baseline_systems, documents, score_systems
from finetune.base.rouge import Rouge
from finetune.base.selection import select


def chunk_to_doc_scores(dataset, chunk_scores: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    parts: dict[str, list[tuple[int, np.ndarray]]] = defaultdict(list)
    for i, sc in chunk_scores.items():
        parts[dataset.source_doc(i)].append((i, sc))
    return {d: np.concatenate([s for _, s in sorted(p, key=lambda t: t[0])]) for d, p in parts.items()}


def system_summaries(docs: list[Document], scores: dict[str, np.ndarray], k: int,
                     trigram_blocking: bool) -> list[list[str]]:
    return [[d.sentences[j] for j in select(scores[d.doc_id], d.sentences, k, trigram_blocking)] for d in docs]


def rouge_of_selection(dataset, chunk_scores: dict[int, np.ndarray], k: int, trigram_blocking: bool,
                       rouge: Rouge | None = None) -> dict[str, float]:
    docs = [d for d in documents(dataset)]
    scores = chunk_to_doc_scores(dataset, chunk_scores)
    docs = [d for d in docs if d.doc_id in scores]
    per_doc = (rouge or Rouge()).score_corpus(system_summaries(docs, scores, k, trigram_blocking),
                                              [d.references for d in docs])
    return {m: float(v.mean()) for m, v in per_doc.items()}


def tune_selection(dataset, chunk_scores: dict[int, np.ndarray], ks=(1, 2, 3, 4, 5)) -> dict[str, Any]:
    """Pick k and trigram blocking on validation by mean ROUGE-1/2/L F1."""
    rouge = Rouge(("rouge1", "rouge2", "rougeL"))
    grid = []
    for k in ks:
        for tb in (False, True):
            r = rouge_of_selection(dataset, chunk_scores, k, tb, rouge)
            grid.append({"k": k, "trigram_blocking": tb,
                         "rouge": (r["rouge1_f"] + r["rouge2_f"] + r["rougeL_f"]) / 3})
    best = max(grid, key=lambda g: g["rouge"])
    return {"k": best["k"], "trigram_blocking": best["trigram_blocking"], "grid": grid}


def evaluate_systems(docs: list[Document], scores: dict[str, np.ndarray] | None, k: int, trigram_blocking: bool,
                     n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """ROUGE (mean and 95% CI) of the extractive model, Lead-3 and the oracle on the same documents."""
    systems: dict[str, list[list[str]]] = {}
    if scores is not None:
        systems["model"] = system_summaries(docs, scores, k, trigram_blocking)
    systems.update(baseline_systems(docs))
    return score_systems(docs, systems, n_resamples, seed)
