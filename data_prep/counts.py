"""Counters that go into the manifests; shard counts add up to the dataset's."""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from hibert.data_prep.records import Skip

log = logging.getLogger("data_prep")

# Counted per dataset (summed over shards); the per-source block has docs_in / kept / skipped.
STAT_KEYS = ("sentences", "tokens", "words", "chunks", "truncated_sentences", "empty_sentences_dropped",
             "split_documents", "extra_chunks", "summary_docs", "summary_sentences",
             # clusters (0 for document datasets)
             "units", "cluster_documents", "truncated_clusters", "dropped_units", "synthetic_clusters")
EXAMPLES_PER_REASON = 5


class Counts:
    def __init__(self, num_sources: int) -> None:
        self.docs_in = [0] * num_sources
        self.kept = [0] * num_sources
        self.skipped = [Counter() for _ in range(num_sources)]
        self.not_relevant = [0] * num_sources   # documents a source's relevant_field dropped from its clusters
        self.stats: Counter = Counter()
        self.splits = {s: Counter() for s in ("train", "valid", "test")}
        self.examples: dict[str, list[dict[str, Any]]] = {}

    def skip(self, source: int, skip: Skip) -> None:
        self.skipped[source][skip.reason] += 1
        ex = self.examples.setdefault(skip.reason, [])
        if len(ex) < EXAMPLES_PER_REASON:
            ex.append({"file": skip.file, "line": skip.line, "detail": skip.detail[:200]})
            log.warning("skipped (%s) %s:%s %s", skip.reason, skip.file, skip.line, skip.detail[:200])

    def to_json(self, names: list[str]) -> dict[str, Any]:
        skipped = Counter()
        for c in self.skipped:
            skipped.update(c)
        return {
            "docs_in": sum(self.docs_in), "kept": sum(self.kept), "skipped": dict(sorted(skipped.items())),
            **{k: self.stats[k] for k in STAT_KEYS},
            "splits": {s: dict(c) for s, c in self.splits.items()},
            "sources": [{"name": n, "docs_in": self.docs_in[i], "kept": self.kept[i],
                         "skipped": dict(sorted(self.skipped[i].items())),
                         "documents_not_relevant": self.not_relevant[i]} for i, n in enumerate(names)],
            "skip_examples": self.examples,
        }


def add_up(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum shard count blocks (same sources, in the same order)."""
    out: dict[str, Any] = {"docs_in": 0, "kept": 0, "skipped": Counter(), **{k: 0 for k in STAT_KEYS},
                           "splits": {s: Counter() for s in ("train", "valid", "test")}, "sources": None,
                           "skip_examples": {}}
    for p in parts:
        out["docs_in"] += p["docs_in"]
        out["kept"] += p["kept"]
        out["skipped"].update(p["skipped"])
        for k in STAT_KEYS:
            out[k] += p.get(k, 0)
        for s, c in p["splits"].items():
            out["splits"][s].update(c)
        if out["sources"] is None:
            out["sources"] = [{"name": s["name"], "docs_in": 0, "kept": 0, "skipped": Counter(),
                               "documents_not_relevant": 0} for s in p["sources"]]
        for acc, s in zip(out["sources"], p["sources"]):
            acc["docs_in"] += s["docs_in"]
            acc["kept"] += s["kept"]
            acc["skipped"].update(s["skipped"])
            acc["documents_not_relevant"] += s.get("documents_not_relevant", 0)   # absent in older shards
        for reason, ex in p["skip_examples"].items():
            room = EXAMPLES_PER_REASON - len(out["skip_examples"].setdefault(reason, []))
            out["skip_examples"][reason] += ex[:max(room, 0)]
    out["skipped"] = dict(sorted(out["skipped"].items()))
    out["splits"] = {s: dict(c) for s, c in out["splits"].items()}
    for s in out["sources"] or []:
        s["skipped"] = dict(sorted(s["skipped"].items()))
    return out
