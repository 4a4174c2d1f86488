"""Merge: combine finished shards into per-split indexes and the dataset manifest.

Exact duplicates across shards are removed here (a shard writes only the first copy it sees): among
documents with the same content hash, in every split, the one first in the input (source, unit, record)
is kept — the same one whatever the number of shards. The
per-split index lists (shard, chunk) of every kept chunk in input order (source, file, record, chunk number),
whatever the number of shards; doc_num_sentences / doc_num_tokens / doc_source are precomputed for
token-budget batching. Statistics of the kept documents are recomputed from per-document arrays, doc ids
are checked to be unique per split.
"""
from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from hibert.config.data import DataConfig
from hibert.data_prep.counts import add_up
from hibert.data_prep.dataset import MANIFEST
from hibert.data_prep.dataset import TOKENIZER as TOKENIZER_FILE
from hibert.data_prep.integrity import record
from hibert.data_prep.plan import PlanMismatch, write_json
from hibert.data_prep.process import SHARDS_DIR, shard_marker
from hibert.data_prep.segment import segmenter_info
from hibert.data_prep.shards import SPLITS, ShardPart, shard_name
from hibert.errors import UserError

FORMAT_VERSION = 1


class MissingShards(RuntimeError):
    pass


def finished_shards(out: Path, plan: dict[str, Any], tokenizer_sha: str) -> tuple[list[dict], list[int]]:
    done, missing = [], []
    for i in range(plan["num_shards"]):
        m = shard_marker(out, i)
        info = json.loads(m.read_text()) if m.is_file() else None
        if info is None or info["plan_hash"] != plan["hash"] or info["tokenizer_sha256"] != tokenizer_sha:
            missing.append(i)
        else:
            done.append(info)
    return done, missing


def _dedup(parts: dict[tuple[str, int], ShardPart]) -> dict[tuple[str, int], np.ndarray]:
    """Per (split, shard): boolean keep-mask over its source documents."""
    keys = sorted(parts)
    if not keys:
        return {}
    hashes, order, which = [], [], []
    for j, k in enumerate(keys):   # one shard's files open at a time (copies; then the maps are dropped)
        hashes.append(np.array(parts[k].src_hash))
        order.append(np.array(parts[k].src_order))
        which.append(np.full(len(hashes[-1]), j, np.int64))
        parts[k].release()
    hashes, order, which = np.concatenate(hashes), np.concatenate(order), np.concatenate(which)
    idx = np.lexsort((order, hashes))
    first = np.ones(len(idx), dtype=bool)
    first[1:] = hashes[idx][1:] != hashes[idx][:-1]
    keep = np.empty(len(idx), dtype=bool)
    keep[idx] = first
    return {k: keep[which == j] for j, k in enumerate(keys)}


_DOC_STATS = ("words", "truncated_sentences", "empty_sentences_dropped", "split_documents", "extra_chunks",
              "summary_docs", "summary_sentences")
_CLUSTER_STATS = ("cluster_documents", "truncated_clusters", "dropped_units", "synthetic_clusters")


def _stat_keys(cfg: DataConfig) -> tuple[str, ...]:
    return _DOC_STATS + (_CLUSTER_STATS if cfg.is_clusters else ())


class DuplicateIds(UserError):
    """Two kept documents of one split share an id: evaluation pairs outputs and references by id."""


def _doc_stats(p: ShardPart, keep: np.ndarray, clusters: bool) -> Counter:
    """Per-document statistics of the kept documents of one shard part (recomputed here, so documents
    removed as duplicates at the merge do not count)."""
    if not keep.any():
        return Counter()
    st = np.asarray(p.src_stats)[keep].astype(np.int64)
    chunks = np.bincount(np.asarray(p.chunk_src), minlength=len(keep))[keep]
    sums = np.diff(np.asarray(p.sum_doc_offsets))[keep]
    out = Counter({"words": int(st[:, 0].sum()), "truncated_sentences": int(st[:, 1].sum()),
                   "empty_sentences_dropped": int(st[:, 2].sum()), "split_documents": int((chunks > 1).sum()),
                   "extra_chunks": int((chunks - 1).sum()),
                   "summary_docs": int(np.asarray(p.src_has_summary)[keep].sum()),
                   "summary_sentences": int(sums.sum())})
    if clusters:
        cs = np.asarray(p.src_cluster_stats)[keep].astype(np.int64)   # documents, dropped units, synthetic
        out.update({"cluster_documents": int(cs[:, 0].sum()), "truncated_clusters": int((cs[:, 1] > 0).sum()),
                    "dropped_units": int(cs[:, 1].sum()), "synthetic_clusters": int(cs[:, 2].sum())})
    return out


def _record(plan: dict[str, Any], order: int) -> str:
    """Where a record is in the input, from its input key (process.input_key)."""
    si, ui, ordinal = order >> 52, (order >> 32) & 0xFFFFF, order & 0xFFFFFFFF
    return f"record {ordinal + 1} of {plan['sources'][si]['units'][ui][0]}"


def _id_hashes(p: ShardPart, rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of the id of each of these documents (equal ids, equal hashes: within this process)."""
    data, off = bytes(p.src_ids), np.asarray(p.src_id_offsets).tolist()
    return np.array([hash(data[off[r]:off[r + 1]]) for r in rows.tolist()], np.int64)


def _check_unique_ids(plan: dict[str, Any], split: str, parts: list[ShardPart], hashes: np.ndarray,
                      where: np.ndarray, order: np.ndarray) -> None:
    """Kept documents of a split must have distinct ids. hashes, where (shard, row) and order (input key) of each
    kept document; only documents whose id hashes collide are read back and compared."""
    idx = np.lexsort((order, hashes))
    for j in np.flatnonzero(hashes[idx][1:] == hashes[idx][:-1]).tolist():
        (sa, ra), (sb, rb) = where[idx[j]].tolist(), where[idx[j + 1]].tolist()
        doc_id = parts[sa].src_id(ra)
        if doc_id == parts[sb].src_id(rb):
            raise DuplicateIds(f"document id {doc_id!r} is used twice in the {split} split: "
                               f"{_record(plan, int(order[idx[j]]))} and {_record(plan, int(order[idx[j + 1]]))}. "
                               "Evaluation pairs documents by id: give the source an id_field that is unique across "
                               "its files, or (without one: ids are <file stem>:<line>) files of distinct names")


def _split_index(cfg: DataConfig, plan: dict[str, Any], split: str, parts: list[ShardPart], keeps: list[np.ndarray],
                 dup_by_source: Counter) -> tuple[dict[str, np.ndarray], Counter, int]:
    """The split's per-chunk arrays, in input order (source, file, record, then chunk number): the same rows in
    the same order whatever the number of shards, and the order a single shard writes."""
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("index", "nsent", "ntok", "nunits", "order", "chunk_no")}
    stats: Counter = Counter()
    ids: dict[str, list[np.ndarray]] = {"hashes": [], "where": [], "order": []}
    for i, (p, k) in enumerate(zip(parts, keeps)):
        for s in np.asarray(p.src_source)[~k]:
            dup_by_source[int(s)] += 1
        chunk_src = np.asarray(p.chunk_src)
        rows = np.flatnonzero(k[chunk_src]) if len(chunk_src) else np.zeros(0, np.int64)
        co, so = np.asarray(p.chunk_offsets), np.asarray(p.sent_offsets)
        src_order = np.asarray(p.src_order)
        cols["index"].append(np.stack([np.full(len(rows), i, np.int64), rows], axis=1))
        cols["nsent"].append((co[rows + 1] - co[rows]).astype(np.int32))
        cols["ntok"].append((so[co[rows + 1]] - so[co[rows]]).astype(np.int32))
        cols["order"].append(src_order[chunk_src[rows]])
        cols["chunk_no"].append(np.asarray(p.chunk_no)[rows])
        if cfg.is_clusters:
            cuo = np.asarray(p.chunk_unit_offsets)
            cols["nunits"].append((cuo[rows + 1] - cuo[rows]).astype(np.int32))
        kept = np.flatnonzero(k)
        ids["hashes"].append(_id_hashes(p, kept))
        ids["where"].append(np.stack([np.full(len(kept), i, np.int64), kept], axis=1))
        ids["order"].append(src_order[kept])
        stats.update(_doc_stats(p, k, cfg.is_clusters))
        p.release()   # thousands of shards: never all of their files open at once

    def cat(xs: list[np.ndarray], dt: type, shape: tuple[int, ...] = (0,)) -> np.ndarray:
        return np.concatenate(xs).astype(dt) if xs else np.zeros(shape, dt)

    _check_unique_ids(plan, split, parts, cat(ids["hashes"], np.int64), cat(ids["where"], np.int64, (0, 2)),
                      cat(ids["order"], np.int64))

    order, chunk_no = cat(cols["order"], np.int64), cat(cols["chunk_no"], np.int64)
    perm = np.lexsort((chunk_no, order))
    order = order[perm]
    new_doc = np.ones(len(order), bool)
    new_doc[1:] = order[1:] != order[:-1]
    arrays = {"index": cat(cols["index"], np.int64, (0, 2))[perm],
              "doc_num_sentences": cat(cols["nsent"], np.int32)[perm],
              "doc_num_tokens": cat(cols["ntok"], np.int32)[perm],
              # dense per-split numbering of source documents (shared by their chunks)
              "doc_source": (np.cumsum(new_doc) - 1).astype(np.int64)}
    if cfg.is_clusters:
        arrays["doc_num_units"] = cat(cols["nunits"], np.int32)[perm]
    return arrays, stats, int(sum(int(k.sum()) for k in keeps))


def merge(cfg: DataConfig, out: Path, plan: dict[str, Any], tokenizer_info: dict[str, Any]) -> dict[str, Any]:
    t0 = time.time()
    sha = tokenizer_info["sha256"]
    done, missing = finished_shards(out, plan, sha)
    if missing:
        raise MissingShards(f"{len(missing)} of {plan['num_shards']} shards are not finished "
                            f"(e.g. {missing[:10]}); run them (--shard-index i) before --merge")
    n = plan["num_shards"]
    parts = {(s, i): ShardPart(out / s / shard_name(i)) for s in SPLITS for i in range(n)}
    if cfg.is_clusters:   # per-cluster counts (src_cluster_stats) joined the shard format after its first version
        old = [p.dir for p in parts.values()
               if (p.dir / "src_stats.npy").is_file() and not (p.dir / "src_cluster_stats.npy").is_file()]
        if old:
            raise PlanMismatch(f"{old[0]}: a cluster shard written by an older version of prep (no "
                               "src_cluster_stats.npy): rerun prep with --fresh")
    if cfg.dedup:
        keep = _dedup(parts)
    else:
        keep = {}
        for k, p in parts.items():
            keep[k] = np.ones(len(p.src_hash), bool)
            p.release()
    counts = add_up([d["counts"] for d in done])
    dup_by_source = Counter()
    splits: dict[str, Any] = {}
    for split in SPLITS:
        arrays, stats, docs = _split_index(cfg, plan, split, [parts[(split, i)] for i in range(n)],
                                           [keep[(split, i)] for i in range(n)], dup_by_source)
        d = out / split
        d.mkdir(parents=True, exist_ok=True)
        for name, arr in arrays.items():
            np.save(d / f"{name}.npy", arr, allow_pickle=False)
        splits[split] = {"docs": docs, "chunks": len(arrays["index"]),
                         "sentences": int(arrays["doc_num_sentences"].sum()),
                         "tokens": int(arrays["doc_num_tokens"].astype(np.int64).sum()),
                         **({"units": int(arrays["doc_num_units"].sum())} if cfg.is_clusters else {}),
                         **{k: int(stats[k]) for k in _stat_keys(cfg)}, "shards": [shard_name(i) for i in range(n)]}
    # stale shard directories from an earlier plan with more shards
    for split in SPLITS:
        for d in (out / split).glob("shard-*"):
            if int(d.name.split("-")[1]) >= n:
                shutil.rmtree(d)
    for m in (out / SHARDS_DIR).glob("shard-*.json"):
        if int(m.stem.split("-")[1]) >= n:
            m.unlink()
    dups = sum(dup_by_source.values())
    # statistics of what the dataset holds (recomputed: shard counts still include cross-shard duplicates)
    for key in ("chunks", "sentences", "tokens", *_stat_keys(cfg), *(("units",) if cfg.is_clusters else ())):
        counts[key] = sum(v[key] for v in splits.values())
    counts["kept"] -= dups
    if dups:
        counts["skipped"]["duplicate"] = counts["skipped"].get("duplicate", 0) + dups
        counts["skipped"] = dict(sorted(counts["skipped"].items()))
        for si, c in dup_by_source.items():
            s = counts["sources"][si]
            s["kept"] -= c
            s["skipped"]["duplicate"] = s["skipped"].get("duplicate", 0) + c
    manifest = build_manifest(cfg, plan, done, counts, splits, tokenizer_info)
    manifest["files"] = record(out, SPLITS, TOKENIZER_FILE)   # checked when it opens
    manifest["dedup"]["removed_at_merge"] = dups
    manifest["merge_seconds"] = round(time.time() - t0, 3)
    write_json(out / MANIFEST, manifest)
    return manifest


def build_manifest(cfg: DataConfig, plan: dict[str, Any], done: list[dict], counts: dict[str, Any],
                   splits: dict[str, Any], tokenizer_info: dict[str, Any]) -> dict[str, Any]:
    checksums: dict[str, str] = {}
    for d in done:
        checksums.update(d["checksums"])
    sources = []
    for i, (s, c) in enumerate(zip(plan["sources"], counts["sources"])):
        src_cfg = cfg.sources[i]
        sources.append({
            "name": s["name"], "format": s["format"], "path": s["path"], "forced_split": src_cfg.split,
            "segmentation": "ptb-tokens" if src_cfg.ptb_tokenized else "segmenter",
            "files": [{"path": u, "bytes": size, "sha256": checksums.get(f"{s['name']}:{u}")}
                      for u, size in s["units"]],
            "docs_in": c["docs_in"], "kept": c["kept"], "skipped": c["skipped"],
            # what part of the source was read: a subset (label-efficiency arms) or each cluster's documents
            **{k: getattr(src_cfg, k) for k in ("max_records", "sample_fraction") if getattr(src_cfg, k) is not None},
            **({"sample_seed": src_cfg.sample_seed} if src_cfg.sample_fraction is not None else {}),
            **({"split_documents": True} if src_cfg.split_documents else {}),
            # the relevant filter: the documents it dropped from this source's clusters (skipped clusters too)
            **({"relevant_field": src_cfg.relevant_field, "documents_not_relevant": c.get("documents_not_relevant", 0)}
               if src_cfg.relevant_field else {}),
            **({"synthetic": src_cfg.synthetic} if src_cfg.is_cluster else {})})
    totals = {k: v for k, v in counts.items() if k not in ("sources", "splits", "skip_examples")}
    filtered = [src for src in sources if "relevant_field" in src]
    if totals["docs_in"] != totals["kept"] + sum(totals["skipped"].values()):
        raise RuntimeError(f"documents unaccounted for: {totals}")
    synthetic = any(c.synthetic for c in cfg.sources) or totals.get("synthetic_clusters", 0) > 0
    return {
        "format_version": FORMAT_VERSION,
        "kind": "clusters" if cfg.is_clusters else "documents",
        "synthetic": synthetic,
        **({"clusters": {"clusters_in": totals["docs_in"], "kept": totals["kept"],
                         "skipped": sum(totals["skipped"].values()),
                         "units": "paragraphs of each document; a longer paragraph is cut into windows of "
                                  f"<= {cfg.max_unit_sentences} sentences",
                         "max_unit_sentences": cfg.max_unit_sentences, "max_cluster_units": cfg.max_cluster_units,
                         **({"documents_not_relevant": sum(src["documents_not_relevant"] for src in filtered),
                             "relevant_filter": "each cluster keeps the documents its source's relevant_field "
                                                "lists; the others are dropped (counted per source)"}
                            if filtered else {}),
                         "unit_scores": "ROUGE-2 recall of the unit against the summary (rouge-score, Porter "
                                        "stemmer): the ranker's labels",
                         "note": ("SYNTHETIC clusters: built by the project, not real multi-document topics"
                                  if synthetic else "real clusters")}} if cfg.is_clusters else {}),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "counts": totals,
        "splits": splits,
        "sources": sources,
        "tokenizer": tokenizer_info,
        "segmenter": segmenter_info(cfg.segmenter) | {
            "ptb_sources": [s["name"] for s, c in zip(plan["sources"], cfg.sources) if c.ptb_tokenized],
            "ptb_rule": "sentences end at a final . ! ? token (PTB-tokenized input); text detokenized"},
        "limits": {"max_sentence_tokens": cfg.max_sentence_tokens, "max_doc_sentences": cfg.max_doc_sentences,
                   "max_doc_chars": cfg.max_doc_chars, "summary_sentences_truncated": False},
        "split": {"method": "blake2b-64(doc_id) / 2^64: < test_fraction -> test, < test+valid -> valid, "
                            "else train (unless forced)",
                  "valid_fraction": cfg.valid_fraction, "test_fraction": cfg.test_fraction},
        "dedup": {"enabled": cfg.dedup, "key": "blake2b-64 of the whitespace-normalized document text",
                  "keeps": "the first copy in input order (source, file, record)"},
        "oracle": {"objective": "ROUGE-1 F + ROUGE-2 F (rouge-score, Porter stemmer)",
                   **cfg.oracle.model_dump(mode="json"),
                   "long_documents": "computed over the whole document, labels cut with it into chunks"},
        "plan": {"hash": plan["hash"], "num_shards": plan["num_shards"]},
        "skip_examples": counts["skip_examples"],
        "shard_seconds": round(sum(d["seconds"] for d in done), 3),
    }
