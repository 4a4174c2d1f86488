"""The shard plan: which slice of which input each shard reads. A pure function of the config and the input
files, so every Slurm array task computes the same plan; saved as plan.json so a resume (or the merge)
uses exactly the plan the shards were made with.

Large inputs are cut into `parts` by record ordinal (record k of a unit goes to part k % parts); pieces are
spread over the shards largest first (LPT), which balances bytes without reading anything. A part's shard
reads its whole unit (gzip cannot seek), so more shards than units multiply the bytes read: prep warns above
2x (`reread_factor`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from hibert.config.data import DataConfig, SourceConfig
from hibert.data_prep import readers
from hibert.data_prep.segment import segmenter_info

PLAN = "plan.json"
VERSION = 1


class PlanMismatch(RuntimeError):
    pass


# source settings added after plans were first written: left out of the digest while at their defaults, so a
# plan made before they existed still matches
_LATER_SOURCE_KEYS = {"split_documents": False, "max_records": None, "sample_fraction": None, "sample_seed": 0,
                      "relevant_field": None}


def _source_settings(source: SourceConfig) -> dict[str, Any]:
    d = source.model_dump(mode="json")
    return {k: v for k, v in d.items() if not (k in _LATER_SOURCE_KEYS and v == _LATER_SOURCE_KEYS[k])}


def content_settings(cfg: DataConfig) -> dict[str, Any]:
    """Every setting that changes what a shard holds (the tokenizer is checked by its hash)."""
    seg = segmenter_info(cfg.segmenter)
    seg.pop("fast_path", None)          # same output either way
    seg.pop("built_by", None)
    return {"sources": [_source_settings(s) for s in cfg.sources],
            "max_sentence_tokens": cfg.max_sentence_tokens, "max_doc_sentences": cfg.max_doc_sentences,
            "max_doc_chars": cfg.max_doc_chars, "valid_fraction": cfg.valid_fraction,
            "test_fraction": cfg.test_fraction, "dedup": cfg.dedup, "oracle": cfg.oracle.model_dump(mode="json"),
            "segmenter": seg}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def auto_num_shards(total_bytes: int, shard_size_mb: float, workers: int) -> int:
    return max(workers, math.ceil(total_bytes / (shard_size_mb * 2**20)))


def build(cfg: DataConfig, num_shards: int | None, workers: int) -> dict[str, Any]:
    if not cfg.sources:
        raise ValueError("data.sources is empty: nothing to prepare")
    sources = []
    for i, s in enumerate(cfg.sources):
        sources.append({"name": readers.source_name(s, i), "format": s.format, "path": s.path,
                        "units": [list(u) for u in readers.list_units(s)]})
    names = [s["name"] for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"data sources need distinct names (doc ids are prefixed with them): {names}")
    total = sum(size for s in sources for _, size in s["units"])
    n = num_shards or cfg.num_shards or auto_num_shards(total, cfg.shard_size_mb, workers)
    pieces = []  # (bytes, source, unit, part, parts)
    for si, s in enumerate(sources):
        for ui, (_, size) in enumerate(s["units"]):
            parts = max(1, min(n, round(n * size / total))) if total else 1
            pieces += [(size / parts, si, ui, p, parts) for p in range(parts)]
    load = [0.0] * n
    shards: list[list[list[int]]] = [[] for _ in range(n)]
    for size, si, ui, p, parts in sorted(pieces, key=lambda x: (-x[0], x[1:])):
        k = min(range(n), key=lambda j: (load[j], j))
        load[k] += size
        shards[k].append([si, ui, p, parts])
    for sh in shards:
        sh.sort()
    plan = {"version": VERSION, "num_shards": n, "settings": content_settings(cfg), "sources": sources,
            "shards": shards}
    plan["hash"] = _digest({k: v for k, v in plan.items()})
    return plan


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, obj: Any) -> None:
    """Atomic (tmp + rename): readers never see half a file, concurrent writers of equal content are fine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_umask())   # mkstemp makes 0600: a dataset is read by the team's jobs, as open() would
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def load(out: Path) -> dict[str, Any] | None:
    p = out / PLAN
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def check_settings(cfg: DataConfig, out: Path, plan: dict[str, Any]) -> None:
    """A merge describes the shards with the config it is given: it must be the one they were made with."""
    now, then = content_settings(cfg), plan["settings"]
    changed = sorted(k for k in now.keys() | then.keys() if now.get(k) != then.get(k))
    if changed:
        raise PlanMismatch(f"{out}: its shards were made with other settings (changed: {', '.join(changed)}); "
                           "merge with the data config the shards were made with, or rerun them with --fresh")


def reread_factor(plan: dict[str, Any]) -> float:
    """Bytes the shards read over the input's bytes: a unit cut into p parts is read p times."""
    parts = {(si, ui): p for shard in plan["shards"] for si, ui, _, p in shard}
    sizes = {(si, ui): size for si, s in enumerate(plan["sources"]) for ui, (_, size) in enumerate(s["units"])}
    total = sum(sizes.values())
    return sum(size * parts.get(k, 1) for k, size in sizes.items()) / total if total else 1.0


def resolve(cfg: DataConfig, out: Path, num_shards: int | None, workers: int, fresh: bool) -> dict[str, Any]:
    """The plan to work with: the saved one when it still matches, else a new one (only with --fresh if
    a different plan is already there)."""
    old = load(out)
    if old is not None and num_shards is None and cfg.num_shards is None:
        num_shards = old["num_shards"]  # resuming: the shard count was fixed when the run started
    plan = build(cfg, num_shards, workers)
    if old is not None and old["hash"] != plan["hash"] and not fresh:
        changed = [k for k in ("num_shards", "settings", "sources") if old.get(k) != plan.get(k)]
        raise PlanMismatch(f"{out} holds data prepared with a different plan (changed: {', '.join(changed)}); "
                           f"rerun with --fresh to redo it, or choose another data.output")
    if old is None or old["hash"] != plan["hash"]:
        write_json(out / PLAN, plan)
    return plan
