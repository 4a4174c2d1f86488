"""What the multi-document heads read from a prepared cluster dataset: the units of each cluster in ranked
order, cut to a token budget (Liu & Lapata 2019 §3: the ranker keeps the top L' paragraphs); the unit
graphs of eq. 24; clusters as report documents, and the cluster baselines every report puts next to a model.

Rankings: `tfidf` (cosine of each unit to the cluster's title, or to the centroid of its units when it has
none — Liu & Lapata's baseline), `oracle` (the ROUGE-2 recall labels: an upper bound, never for test
numbers), `lead` (document order), or scores from a learned ranker (`RankedClusters(..., scores=...)`).
The view computes every cluster's order once (numpy) and is picklable, so DataLoader workers stay pure."""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from hibert import tfidf
from hibert.config.mds import BUILTIN_RANKINGS, MDSConfig
from hibert.finetune.base.views import RowView
from hibert.finetune.evaluation.report import Document
from hibert.tfidf import unit_graph
from hibert.tokens import SEP_ID  # noqa: F401  (re-exported for the tasks' targets)


def tfidf_scores(unit_texts: Sequence[str], query: str | None = None) -> np.ndarray:
    """Cosine between each unit's tf-idf vector (idf over the cluster's units; hibert/tfidf.py) and the query's
    (the title), or the centroid of the unit vectors without a query."""
    return tfidf.cosine_to_query(unit_texts, query)


def rank_order(scores: np.ndarray) -> np.ndarray:
    """Units by descending score; ties keep document order (stable)."""
    return np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")


def budget_cut(order: np.ndarray, unit_tokens: np.ndarray, budget: int, top: int | None) -> np.ndarray:
    """The prefix of `order` whose units' tokens fit `budget` and at most `top` units — but always the first
    unit, even when it alone is longer than a budget below one unit (≤ data.max_unit_sentences sentences)."""
    cum = np.cumsum(np.asarray(unit_tokens)[order])
    keep = max(1, int(np.searchsorted(cum, budget, side="right")))
    if top is not None:
        keep = min(keep, top)
    return order[:keep]


class RankedClusters(RowView):
    """A view of a cluster `DocumentDataset` split: item i = the selected units of cluster i in rank order
    (a list of unit Documents, `units(i)`), `__getitem__` = their sentences back to back (what a flat
    single-document model reads). Only clusters with a summary are kept (`rows`). With `title_unit`, a
    cluster's title (where it has one) comes first, as unit 0 — Liu & Lapata's summarizer reads "the title
    and the L' best paragraphs"; it is not counted against the budget, and takes one of `max_units`."""
    def __init__(self, dataset, ranking: str = "tfidf", budget: int = 800, top: int | None = None,
                 scores: Sequence[np.ndarray] | None = None, max_units: int | None = None, title_unit: bool = False):
        if not getattr(dataset, "is_clusters", False):
            raise ValueError(f"{dataset.dir} is not a cluster dataset (manifest kind: "
                             f"{dataset.manifest.get('kind', 'documents')}); multi-document heads need clusters")
        if scores is None and ranking not in BUILTIN_RANKINGS:
            raise ValueError(f"ranking must be one of {BUILTIN_RANKINGS} or learned scores, not {ranking!r}")
        self.base, self.ranking, self.budget, self.top = dataset, ranking if scores is None else "ranker", budget, top
        self.max_units = max_units
        keep = [i for i in range(len(dataset)) if dataset.summary(i) is not None]
        self.rows = np.asarray(keep, dtype=np.int64)
        self.skipped_no_summary = len(dataset) - len(keep)
        orders, lens, nsents, titled = [], [], [], []
        for k, i in enumerate(keep):
            unit_tokens = self._unit_tokens(i)
            if scores is not None:
                s = np.asarray(scores[k], dtype=np.float64)
                if len(s) != len(unit_tokens):
                    raise ValueError(f"ranker scores for cluster {dataset.doc_id(i)}: {len(s)} scores for "
                                     f"{len(unit_tokens)} units")
            elif ranking == "tfidf":
                s = tfidf_scores([" ".join(u) for u in dataset.units_text(i)], dataset.title(i))
            elif ranking == "oracle":
                s = dataset.unit_scores(i)
            else:
                s = -np.arange(len(unit_tokens), dtype=np.float64)
            top_units = top if max_units is None else min(top or max_units, max_units)
            title = dataset.title_ids(i) if title_unit and (max_units is None or max_units > 1) else None
            if title is not None and top_units is not None:
                top_units = max(1, top_units - (1 if max_units is not None and top_units >= max_units else 0))
            sel = budget_cut(rank_order(s), unit_tokens, budget, top_units)
            orders.append(sel)
            titled.append(title is not None)
            n_sents = int(self._unit_sentences(i)[sel].sum()) + (title is not None)
            nsents.append(n_sents)
            words = int(unit_tokens[sel].sum()) + (len(title[0]) + 1 if title is not None else 0)
            lens.append(words - n_sents)   # words only, as DocumentDataset counts
        self.order_offsets = np.concatenate([[0], np.cumsum([len(o) for o in orders])]).astype(np.int64)
        self.orders = np.concatenate(orders).astype(np.int64) if orders else np.zeros(0, np.int64)
        self.doc_num_tokens = np.asarray(lens, dtype=np.int64)
        self.doc_num_sentences = np.asarray(nsents, dtype=np.int64)
        self.doc_source = np.arange(len(keep), dtype=np.int64)
        self.titled = np.asarray(titled, dtype=bool)   # view item k reads its title as unit 0

    # ------------------------------------------------------------------ per cluster
    def _unit_tokens(self, i: int) -> np.ndarray:
        """Tokens (+ one EOS per sentence) of every unit of base cluster i."""
        sents = self.base[i]
        sent_tokens = np.fromiter((len(s) + 1 for s in sents), np.int64, len(sents))
        o = np.asarray(self.base.unit_offsets(i), dtype=np.int64)
        return np.add.reduceat(sent_tokens, o[:-1]) if len(o) > 1 else np.zeros(0, np.int64)

    def _unit_sentences(self, i: int) -> np.ndarray:
        return np.diff(np.asarray(self.base.unit_offsets(i), dtype=np.int64))

    def order(self, k: int) -> np.ndarray:
        """Unit numbers (within the cluster) of view item k, in rank order."""
        return self.orders[self.order_offsets[k]:self.order_offsets[k + 1]]

    def units(self, k: int) -> list[list[np.ndarray]]:
        row = int(self.rows[k])
        all_units = self.base.units(row)
        title = [self.base.title_ids(row)] if self.titled[k] else []
        return title + [all_units[j] for j in self.order(k).tolist()]

    def units_text(self, k: int) -> list[list[str]]:
        row = int(self.rows[k])
        all_units = self.base.units_text(row)
        title = [[self.base.title(row)]] if self.titled[k] else []
        return title + [all_units[j] for j in self.order(k).tolist()]

    def __getitem__(self, k: int) -> list[np.ndarray]:
        return [s for u in self.units(k) for s in u]

    def sentences_text(self, k: int) -> list[str]:
        return [s for u in self.units_text(k) for s in u]

    def __repr__(self) -> str:
        return f"RankedClusters({self.base!r}, ranking={self.ranking}, budget={self.budget}, clusters={len(self)})"

    def chunk_index(self, k: int) -> int:
        return 0


def cluster_graphs(view, rows: list[int], mds: MDSConfig) -> list[np.ndarray]:
    """Liu & Lapata eq. 24's unit graph of each selected cluster: tf-idf cosine between its units, on their
    words (eq. 25) or, for `graph_weighting: sublinear`, their subword ids."""
    return [units_graph(view.units_text(i), view.units(i), mds) for i in rows]


def units_graph(texts: Sequence[Sequence[str]], ids: Sequence[Sequence[np.ndarray]], mds: MDSConfig) -> np.ndarray:
    """The unit graph of one cluster from its units, each as sentence texts and as sentence subword ids."""
    if mds.graph_weighting == "eq25":
        return unit_graph([" ".join(u) for u in texts], mds.graph_threshold, "eq25")
    return unit_graph([np.concatenate(u) if len(u) else np.zeros(0, np.int64) for u in ids], mds.graph_threshold,
                      mds.graph_weighting)


def graph_note(mds: MDSConfig) -> str:
    """What a report says of the unit graph its model read."""
    if not mds.graph_attention:
        return "none (no graph-informed head)"
    how = ("eq. 25 tf-idf (N_w log(N_d/N_dw)) on words" if mds.graph_weighting == "eq25"
           else "sublinear tf x smoothed idf on subword ids")
    return f"{how}, edges < {mds.graph_threshold} dropped (Liu & Lapata eq. 24)"


# -------------------------------------------------------------------------------------------- baselines
def lead_first_document(sentences: Sequence[str], sentence_doc: Sequence[int], k: int = 3) -> list[str]:
    """Lead-k as most multi-document papers define it: the first k sentences of the first document."""
    first = [s for s, d in zip(sentences, sentence_doc) if d == sentence_doc[0]] if len(sentences) else []
    return list(first[:k])


def lead_tokens(sentences: Sequence[str], gold_words: int) -> list[str]:
    """Liu & Lapata's Lead: the first words of the documents back to back, as many as the gold summary
    has (cut inside the last sentence if need be)."""
    out, used = [], 0
    for s in sentences:
        words = s.split()
        if used + len(words) >= gold_words:
            out.append(" ".join(words[: gold_words - used]))
            break
        out.append(s)
        used += len(words)
    return [s for s in out if s]


def tfidf_extract(sentences: Sequence[str], k: int = 3, redundancy: float = 0.5) -> list[str]:
    """An unsupervised extractive baseline (centroid / LexRank-style): sentences by tf-idf cosine to the
    cluster centroid, skipping any that is too similar (cosine > `redundancy`) to one already taken; the
    chosen sentences in score order."""
    if not sentences:
        return []
    scores = tfidf_scores(list(sentences))
    order = np.argsort(-scores, kind="stable").tolist()
    bags = [Counter(tfidf.words(s)) for s in sentences]  # raw counts: the redundancy filter's cosine

    def cos(a, b) -> float:
        num = sum(c * b.get(w, 0) for w, c in a.items())
        den = np.sqrt(sum(c * c for c in a.values()) * sum(c * c for c in b.values()))
        return num / den if den else 0.0

    chosen: list[int] = []
    for j in order:
        if len(chosen) == k:
            break
        if all(cos(bags[j], bags[c]) <= redundancy for c in chosen):
            chosen.append(j)
    return [sentences[j] for j in chosen]


ORACLE_NOTE = " — the oracle reads the references: an upper bound, not a result"


SYNTHETIC_NOTE = ("SYNTHETIC clusters: single-document news articles grouped with their tf-idf nearest neighbours "
                  "(not real multi-document topics)")


def data_note(dataset) -> dict[str, Any]:
    m = dataset.manifest
    out = {"clusters": "synthetic" if m.get("synthetic") else "real"}
    if m.get("synthetic"):
        out["note"] = SYNTHETIC_NOTE
    return out


def ranked_sentences(view, k: int) -> list[str]:
    """Cluster k's title (if any) then its units in the view's rank order, as sentences."""
    title = view.title(k)
    read = getattr(view, "titled", None)
    if read is not None and read[k]:  # the view already reads it as unit 0
        return view.sentences_text(k)
    return ([title] if title else []) + view.sentences_text(k)


def cluster_document(view, k: int) -> tuple[Document, list[int]]:
    """Cluster k of a view as a `Document` (every sentence, documents in order) and each sentence's document."""
    base, row = view.base, int(view.rows[k])
    units = base.units_text(row)
    unit_docs = np.asarray(base.unit_docs(row)).tolist()
    sents = [s for u in units for s in u]
    sent_doc = [d for u, d in zip(units, unit_docs) for _ in u]
    return Document(base.doc_id(row), sents, [base.summary_text(row)], None), sent_doc


def all_units_view(dataset):
    """Every unit of every cluster with a summary, in document order (the ranker scores all of them)."""
    return RankedClusters(dataset, ranking="lead", budget=np.iinfo(np.int64).max // 2)
