"""The ranker's export (encoder + ranker.safetensors + ranker.json), its loader and batched scoring of the
units of clusters (single process, no DeepSpeed)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hibert.config.mds import MDSConfig
from hibert.finetune.base.exports import load_head_export
from hibert.json_files import read_json_object
from hibert.modeling.ranker import HibertRanker, ranker_input

RANKER_WEIGHTS = "ranker.safetensors"


RANKER_CONFIG = "ranker.json"


@torch.no_grad()
def score_clusters(model: torch.nn.Module, clusters: list[list[list[np.ndarray]]], device: torch.device | str,
                   titles: list[list[np.ndarray] | None] | None = None, max_tokens: int = 32768) -> list[np.ndarray]:
    """Ranker scores of every unit of every cluster (clusters batched up to `max_tokens`), in input order.
    `titles`: each cluster's title as sentences of ids, or None (a title-conditioned ranker then reads the
    cluster's centroid)."""
    out: list[np.ndarray] = []
    batch: list[list[list[np.ndarray]]] = []
    batch_titles: list[list[np.ndarray] | None] = []
    titles = titles if titles is not None else [None] * len(clusters)
    tokens = 0

    def flush() -> None:
        if batch:
            s = model(ranker_input(batch, batch_titles).to(device)).float().cpu().numpy()
            counts = [len(c) for c in batch]
            out.extend(np.split(s, np.cumsum(counts)[:-1]))
            batch.clear()
            batch_titles.clear()

    for c, t in zip(clusters, titles):
        n = sum(len(s) + 1 for u in c for s in u)
        if batch and tokens + n > max_tokens:
            flush()
            tokens = 0
        batch.append(c)
        batch_titles.append(t)
        tokens += n
    flush()
    return out


def load_ranker(export_dir: Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict]:
    """(ranker in eval mode, settings) from an export written by this task."""
    export_dir = Path(export_dir)
    settings = {}

    def build(model_cfg):
        settings["mds"] = MDSConfig.from_export(read_json_object(export_dir / RANKER_CONFIG)["mds"])
        return HibertRanker(model_cfg, settings["mds"].ranker_pool)

    model, meta, model_cfg = load_head_export(
        export_dir, device, weights=RANKER_WEIGHTS, required=(RANKER_WEIGHTS, RANKER_CONFIG), build=build,
        missing=lambda d, name: f"{d} holds no ranker ({name}): pass a model produced by "
                                "`hibert finetune finetune.task=ranker`")
    return model, {**meta, "mds": settings["mds"].model_dump(), "model": model_cfg.model_dump()}
