"""How good a unit ranking is, as Liu & Lapata 2019 measure it (Table 1): ROUGE-L recall of the top L'
units (concatenated, in rank order) against the target summary, for L' = 5, 10, 20, 40, per cluster, so two
rankings of the same clusters can be compared with a paired bootstrap."""
from __future__ import annotations

from typing import Sequence

import numpy as np
from rouge_score import rouge_scorer

CUTOFFS = (5, 10, 20, 40)


def selection_recall(units_text: Sequence[Sequence[str]], summary: Sequence[str], order: np.ndarray,
                     cutoffs: Sequence[int] = CUTOFFS, scorer: rouge_scorer.RougeScorer | None = None
                     ) -> dict[int, float]:
    """ROUGE-L recall (x100, rouge-score, stemmed) of the first L' units of `order` for every cutoff.
    `units_text`: every unit of the cluster as its sentences; `order`: unit numbers, best first."""
    scorer = scorer or rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    ref = " ".join(summary)
    out = {}
    for cut in cutoffs:
        text = " ".join(s for j in np.asarray(order)[:cut].tolist() for s in units_text[j])
        out[cut] = 100 * scorer.score(ref, text)["rougeL"].recall
    return out


def ranking_table(units_text: Sequence[Sequence[Sequence[str]]], summaries: Sequence[Sequence[str]],
                  orders: dict[str, Sequence[np.ndarray]], cutoffs: Sequence[int] = CUTOFFS
                  ) -> dict[str, dict[int, np.ndarray]]:
    """{ranking name: {L': per-cluster ROUGE-L recall}} for several rankings of the same clusters."""
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    table: dict[str, dict[int, np.ndarray]] = {}
    for name, per_cluster in orders.items():
        rows = [selection_recall(u, s, o, cutoffs, scorer) for u, s, o in zip(units_text, summaries, per_cluster)]
        table[name] = {c: np.array([r[c] for r in rows]) for c in cutoffs}
    return table


def recall_at(scores: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Share of the k best units by label (ROUGE-2 recall) that the ranking puts in its top k: a cheap
    validation signal that needs no ROUGE-L."""
    k = min(k, len(scores))
    if k == 0:
        return 0.0
    best = set(np.argsort(-labels, kind="stable")[:k].tolist())
    got = set(np.argsort(-scores, kind="stable")[:k].tolist())
    return len(best & got) / k
