"""ROUGE with rouge-score (Google's reimplementation, Porter stemming on), per document, with bootstrap
95% confidence intervals. Reported numbers are rouge-score's, not the Perl ROUGE-1.5.5 of the papers
(they differ slightly). With several references a document scores the max F over references per metric
(its P and R are taken from that same reference). ROUGE-Lsum splits sentences on newlines."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


class Rouge:
    def __init__(self, metrics: Sequence[str] = METRICS, stemmer: bool = True):
        self.metrics = tuple(metrics)
        # imported here: rouge-score pulls in nltk (~1.4 s), which the bootstrap helpers below, `hibert compare`
        # and every command's --help do not need
        from rouge_score import rouge_scorer

        self.scorer = rouge_scorer.RougeScorer(list(self.metrics), use_stemmer=stemmer)

    def score_doc(self, prediction: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
        """prediction: summary sentences; references: one or more references, each a list of sentences.
        Returns {metric_p, metric_r, metric_f} per metric, in [0, 100]."""
        if not references:
            raise ValueError("a document needs at least one reference")
        pred = "\n".join(prediction)
        best: dict[str, tuple[float, float, float]] = {}
        for ref in references:
            s = self.scorer.score("\n".join(ref), pred)
            for m in self.metrics:
                cur = (s[m].fmeasure, s[m].precision, s[m].recall)
                if m not in best or cur[0] > best[m][0]:
                    best[m] = cur
        out: dict[str, float] = {}
        for m, (f, p, r) in best.items():
            out[f"{m}_f"], out[f"{m}_p"], out[f"{m}_r"] = 100 * f, 100 * p, 100 * r
        return out

    def score_corpus(self, predictions: Sequence[Sequence[str]],
                     references: Sequence[Sequence[Sequence[str]]]) -> dict[str, np.ndarray]:
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
        rows = [self.score_doc(p, r) for p, r in zip(predictions, references)]
        return {k: np.array([row[k] for row in rows]) for k in (rows[0] if rows else {})}


def bootstrap_ci(values: np.ndarray, n_resamples: int = 1000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over documents."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n_resamples, len(values)))
    means = values[idx].mean(axis=1)
    return float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_resamples: int = 1000, seed: int = 0,
                     alpha: float = 0.05) -> dict[str, float]:
    """Paired bootstrap of mean(a - b) over the same documents (Koehn 2004; Berg-Kirkpatrick et al. 2012):
    the difference, its percentile CI, and a two-sided p-value (twice the smaller share of resampled
    differences on either side of 0). Pairing removes the between-document variance that makes two
    overlapping per-system CIs uninformative."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired scores need the same documents: {a.shape} vs {b.shape}")
    d = a - b
    if len(d) == 0:
        return {"diff": float("nan"), "low": float("nan"), "high": float("nan"), "p_value": float("nan"),
                "resamples": n_resamples}
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n_resamples, len(d)))].mean(axis=1)
    p = 2 * min(float((means <= 0).mean()), float((means >= 0).mean()))
    return {"diff": float(d.mean()), "low": float(np.quantile(means, alpha / 2)),
            "high": float(np.quantile(means, 1 - alpha / 2)), "p_value": min(1.0, p), "resamples": n_resamples}


def format_p(p: float, resamples: int) -> str:
    """A bootstrap p-value of 0 only says p < 1/resamples."""
    return f"p<{1 / resamples:.2g}" if p == 0 else f"p={p:.3f}"


def summarize_scores(per_doc: dict[str, np.ndarray], n_resamples: int = 1000, seed: int = 0) -> dict[str, dict]:
    """{metric: {mean, low, high}} for every per-document score array."""
    out = {}
    for k, v in per_doc.items():
        lo, hi = bootstrap_ci(v, n_resamples, seed)
        out[k] = {"mean": float(np.mean(v)) if len(v) else float("nan"), "low": lo, "high": hi}
    return out
