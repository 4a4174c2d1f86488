"""The one tf-idf of the platform: unit rankings and the cluster baselines (finetune/base/clusters.py), the
unit graph of Liu & Lapata's eq. 24 (`unit_graph`), and the nearest neighbours of the SYNTHETIC clusters
(data_prep/synthetic_clusters.py).

Tokenisation, the same everywhere: a text is its lower-cased runs of [a-z0-9] (`words`); a unit already
encoded is its subword ids. Weights: sublinear tf 1 + log(count) times the smoothed idf
log((1 + N) / (1 + df)) + 1 over the N rows compared (a cluster's units, or a split's articles) — except the
unit graph's default, which is Liu & Lapata's eq. 25 as printed (`weigh_eq25`); rows are L2-normalised, so a
dot product is a cosine."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def smoothed_idf(df: np.ndarray, n: int) -> np.ndarray:
    return np.log((1 + n) / (1 + np.asarray(df, dtype=np.float64))) + 1.0


def count_matrix(rows: Sequence[Sequence]) -> tuple[np.ndarray, np.ndarray]:
    """(vocabulary [V] sorted, counts [N, V]) of token sequences (words or ids)."""
    n = len(rows)
    lens = np.fromiter((len(r) for r in rows), dtype=np.int64, count=n)
    flat = [t for r in rows for t in r]
    if not flat:
        return np.zeros(0), np.zeros((n, 0))
    vocab, inverse = np.unique(np.asarray(flat), return_inverse=True)
    v = len(vocab)
    row_of = np.repeat(np.arange(n, dtype=np.int64), lens)
    return vocab, np.bincount(row_of * v + inverse.reshape(-1), minlength=n * v).reshape(n, v).astype(np.float64)


def weigh(counts: np.ndarray) -> np.ndarray:
    """Sublinear tf x smoothed idf over the rows of `counts [N, V]`, rows L2-normalised (an empty row stays 0)."""
    n = counts.shape[0]
    w = np.where(counts > 0, 1.0 + np.log(np.maximum(counts, 1.0)), 0.0) * smoothed_idf((counts > 0).sum(0), n)
    norm = np.linalg.norm(w, axis=1, keepdims=True)
    return np.divide(w, norm, out=np.zeros_like(w), where=norm > 0)


def weigh_eq25(counts: np.ndarray) -> np.ndarray:
    """Liu & Lapata 2019, appendix eq. 25: v_ik = N_w(t_k) log(N_d / N_dw(t_k)) — raw count times the
    unsmoothed idf over the N_d rows (a word in every row weighs 0) — rows L2-normalised (an empty or
    all-common row stays 0: it then has no edge but its self loop)."""
    n = counts.shape[0]
    df = (counts > 0).sum(0)
    w = counts * np.log(n / np.maximum(df, 1))
    norm = np.linalg.norm(w, axis=1, keepdims=True)
    return np.divide(w, norm, out=np.zeros_like(w), where=norm > 0)


GRAPH_WEIGHTS = {"eq25": weigh_eq25, "sublinear": weigh}


def cosine_to_query(texts: Sequence[str], query: str | None = None) -> np.ndarray:
    """Cosine between each text's tf-idf vector (idf over `texts`) and the query's, or — without a query, or
    one with no word — the centroid of the text vectors. (Columns in first-occurrence order: rankings by these
    scores break exact ties the same way on every run.)"""
    n = len(texts)
    if n == 0:
        return np.zeros(0, np.float64)
    bags = [Counter(words(t)) for t in texts]
    df: Counter = Counter()
    for b in bags:
        df.update(b.keys())
    vocab = {w: j for j, w in enumerate(df)}
    idf = smoothed_idf(np.fromiter(df.values(), np.float64, len(df)), n)
    counts = np.zeros((n, len(vocab)))
    for i, b in enumerate(bags):
        for w, c in b.items():
            counts[i, vocab[w]] = c
    mat = weigh(counts)
    q_bag = Counter(words(query)) if query is not None else Counter()
    if q_bag:
        q = np.zeros(len(vocab))
        for w, c in q_bag.items():
            if w in vocab:
                q[vocab[w]] = (1.0 + np.log(c)) * idf[vocab[w]]
    else:
        q = mat.mean(0)
    qn = np.linalg.norm(q)
    return mat @ (q / qn) if qn > 0 else np.zeros(n)


def unit_graph(units: Sequence[Sequence[int]] | Sequence[str], threshold: float,
               weighting: str = "eq25") -> np.ndarray:
    """Liu & Lapata eq. 24's graph [U, U] float32: tf-idf cosine between the units of one cluster (each a
    text: its words, or its subword ids), edges below `threshold` dropped, self loops 1 (an empty unit gets
    only its self loop). `weighting`: "eq25" (the paper's appendix, meant for words) or "sublinear" (sublinear
    tf x smoothed idf, what exports made before eq. 25 used, on subword ids). Symmetric and NOT
    row-normalised: the global layer's graph head (`modeling.hierarchical.graph_weights`) normalises each row
    over the real units of the batch's grid."""
    if weighting not in GRAPH_WEIGHTS:
        raise ValueError(f"unit graph weighting {weighting!r}: use one of {sorted(GRAPH_WEIGHTS)}")
    n = len(units)
    if n == 0:
        return np.zeros((0, 0), np.float32)
    if all(isinstance(u, str) for u in units):
        rows = [words(u) for u in units]  # type: ignore[arg-type]
    else:
        rows = [np.asarray(u, dtype=np.int64).reshape(-1).tolist() for u in units]
    w = GRAPH_WEIGHTS[weighting](count_matrix(rows)[1])
    g = w @ w.T
    g[g < threshold] = 0.0
    np.fill_diagonal(g, 1.0)
    return g.astype(np.float32)


def sparse_matrix(texts: Sequence[str]):
    """Rows L2-normalised sublinear-tf x smoothed-idf vectors of many texts (scipy CSR; a corpus-sized
    vocabulary stays sparse)."""
    from scipy import sparse  # lazy: ~0.19 s; only the synthetic-cluster builder needs scipy

    vocab: dict[str, int] = {}
    rows, cols, vals = [], [], []
    for i, t in enumerate(texts):
        for w, c in Counter(words(t)).items():
            rows.append(i)
            cols.append(vocab.setdefault(w, len(vocab)))
            vals.append(1.0 + np.log(c))
    m = sparse.csr_matrix((vals, (rows, cols)), shape=(len(texts), len(vocab)), dtype=np.float64)
    m = m @ sparse.diags(smoothed_idf(np.bincount(m.indices, minlength=len(vocab)), len(texts)))
    norms = np.sqrt(np.asarray(m.multiply(m).sum(1)).ravel())
    return sparse.diags(np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)) @ m
