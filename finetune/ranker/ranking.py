"""How a run ranks the units of its clusters before the budget cut (`mds.ranking`): tfidf, lead, oracle, or
a learned ranker, whose scores are computed once on rank 0, cached in the run directory and pinned to the
ranker version that produced them (so a resumed run, evaluate and summarize rank alike)."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from hibert.config import Config
from hibert.config.mds import ranking_kind
from hibert.finetune.base.clusters import RankedClusters, all_units_view
from hibert.finetune.ranker.export import load_ranker, score_clusters
from hibert.registry import pin_model_ref, resolve_model, tracking_uri

log = logging.getLogger("hibert")


def trained_mds_settings(cfg: Config) -> dict:
    """`cfg.mds` as the run read it: a learned ranker's alias replaced by the version that ranked the training
    split, so evaluate and summarize rank with that ranker even after the alias moves."""
    settings = cfg.mds.model_dump(mode="json")
    cache = cfg.run_dir / "rankings" / "train.npz"
    if ranking_kind(settings["ranking"]) == "learned" and cache.is_file() and _cached_ranker(cache) == settings["ranking"]:
        settings["ranking"] = _cached_ranker(cache, "pinned")
    return settings


# -------------------------------------------------------------------------------------------- ranking
def ranked_view(cfg: Config, dataset, rt=None, run_dir: Path | None = None, reuse: bool = False):
    """`dataset` (a cluster split) ranked by `mds.ranking` and cut to `mds.budget_tokens` / `mds.top_units` /
    `mds.max_units`. A learned ranker (`models:/hibert-ranker@...` or an export dir) scores the split once on
    rank 0; the scores are written to <run dir>/rankings/ and read by every rank. `reuse` (training): scores
    already written by this run for the same ranker reference are read back, so a resumed run ranks exactly
    as it started even if the registry alias has moved since, and does not rescore the split."""
    m = cfg.mds
    common = {"budget": m.budget_tokens, "top": m.top_units, "max_units": m.max_units, "title_unit": m.title_unit}
    if m.ranking_kind != "learned":
        return RankedClusters(dataset, m.ranking, **common)
    run_dir = run_dir or cfg.run_dir
    path = run_dir / "rankings" / f"{dataset.split}.npz"
    is_main = rt is None or rt.is_main
    cached = reuse and path.is_file() and _cached_ranker(path) == m.ranking
    if is_main and cached:
        log.info("reusing the %s rankings this run computed at its start (%s)", dataset.split, path)
    if is_main and not cached:
        scores, pinned = learned_scores(cfg, dataset, m.ranking, run_dir, rt.device if rt is not None else "cpu")
        path.parent.mkdir(parents=True, exist_ok=True)
        flat = np.concatenate(scores) if scores else np.zeros(0, np.float32)
        np.savez(path, scores=flat, counts=np.array([len(s) for s in scores], np.int64), ranker=np.array(m.ranking),
                 pinned=np.array(pinned))
    if rt is not None and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()
    with np.load(path, allow_pickle=False) as z:
        scores = np.split(z["scores"], np.cumsum(z["counts"])[:-1]) if len(z["counts"]) else []
    return RankedClusters(dataset, scores=scores, **common)


def _cached_ranker(path: Path, field: str = "ranker") -> str:
    with np.load(path, allow_pickle=False) as z:
        return str(z[field]) if field in z else str(z["ranker"])


def learned_scores(cfg: Config, dataset, ref: str, run_dir: Path, device) -> tuple[list[np.ndarray], str]:
    """A learned ranker's scores for every unit of every cluster of `dataset` that has a summary, and the
    ranker read (an alias pinned to its version: models:/hibert-ranker/3)."""
    uri = tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    pinned = pin_model_ref(ref, uri)
    model, meta = load_ranker(resolve_model(pinned, uri, run_dir / "ranker"), device)
    view = all_units_view(dataset)
    log.info("ranking %d %s clusters with %s (%s)", len(view), dataset.split, ref, pinned)
    n = len(view)
    return score_clusters(model, [view.units(i) for i in range(n)], device, [view.title_ids(i) for i in range(n)]), pinned
