"""ROUGE with rouge-score (Google's reimplementation, Porter stemming on), per document, with bootstrap
95% confidence intervals. Reported numbers are rouge-score's, not the Perl ROUGE-1.5.5 of the papers
(they differ slightly). With several references a document scores the max F over references per metric
(its P and R are taken from that same reference). ROUGE-Lsum splits sentences on newlines.

Scores are exactly rouge-score's (the model card names it): the texts are passed as they are. `nfkc=True`
NFKC-normalises both sides first, an option off by default: rouge-score keeps only ASCII letters and digits, so a
decoder's copied "ﬁnal" (a ligature SentencePiece's nmt_nfkc undid) would score as "nal" against "final" — but
NFKC also rewrites "8½" as "81⁄2", a new token "81", so it is not a harmless default."""
from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np

METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


class Rouge:
    def __init__(self, metrics: Sequence[str] = METRICS, stemmer: bool = True, nfkc: bool = False):
        self.metrics = tuple(metrics)
        self.normalise = _nfkc if nfkc else _as_is
        # imported here: rouge-score pulls in nltk (~1.4 s), which the bootstrap helpers below, `hibert compare`
        # and every command's --help do not need
        from rouge_score import rouge_scorer

        self.scorer = rouge_scorer.RougeScorer(list(self.metrics), use_stemmer=stemmer)

    def score_doc(self, prediction: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
        """prediction: summary sentences; references: one or more references, each a list of sentences.
        Returns {metric_p, metric_r, metric_f} per metric, in [0, 100]."""
        if not references:
            raise ValueError("a document needs at least one reference")
        pred = self.normalise("\n".join(prediction))
        best: dict[str, tuple[float, float, float]] = {}
        for ref in references:
            s = self.scorer.score(self.normalise("\n".join(ref)), pred)
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


def _nfkc(text: str) -> str:
    return text if text.isascii() else unicodedata.normalize("NFKC", text)


def _as_is(text: str) -> str:
    return text


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


def seeded_paired_bootstrap(a: np.ndarray, b: np.ndarray, n_resamples: int = 1000, seed: int = 0,
                            alpha: float = 0.05) -> dict[str, float]:
    """Paired bootstrap over documents AND seeds: `a [Sa, N]`, `b [Sb, N]` are per-document scores of two
    systems, one row per training seed, on the same N documents. Each resample draws N documents and, per
    system, its seeds with replacement; the statistic is the mean over the drawn documents of (a averaged over
    its drawn seeds) - (b likewise). The interval then carries the seed-to-seed variance that one seed hides
    (a second seed of the same model can differ from the first by more than two systems do). With one seed
    each it is `paired_bootstrap`, to the digit."""
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"paired scores need the same documents: {a.shape[1]} vs {b.shape[1]}")
    if a.shape[0] == 1 and b.shape[0] == 1:
        return paired_bootstrap(a[0], b[0], n_resamples, seed, alpha)
    n = a.shape[1]
    d = a.mean(0) - b.mean(0)
    if n == 0:
        return paired_bootstrap(d, d, n_resamples, seed, alpha)
    rng = np.random.default_rng(seed)
    docs = rng.integers(0, n, size=(n_resamples, n))
    means = np.empty(n_resamples)
    for r in range(n_resamples):  # [S, N] per resample: a loop keeps memory at one resample's size
        sa = a[rng.integers(0, a.shape[0], a.shape[0])].mean(0)
        sb = b[rng.integers(0, b.shape[0], b.shape[0])].mean(0)
        means[r] = (sa[docs[r]] - sb[docs[r]]).mean()
    p = 2 * min(float((means <= 0).mean()), float((means >= 0).mean()))
    return {"diff": float(d.mean()), "low": float(np.quantile(means, alpha / 2)),
            "high": float(np.quantile(means, 1 - alpha / 2)), "p_value": min(1.0, p), "resamples": n_resamples,
            "seeds": [int(a.shape[0]), int(b.shape[0])]}


def verdict(low: float, high: float) -> str:
    """How a difference's 95% interval reads: an interval that crosses 0 is no measurable difference."""
    if not (low > 0 or high < 0):
        return "no measurable difference"
    return "higher" if low > 0 else "lower"


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
