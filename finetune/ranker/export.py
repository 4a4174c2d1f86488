"""The ranker's export (encoder + ranker.safetensors + ranker.json), its loader and batched scoring of the
units of clusters (single process, no DeepSpeed)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from hibert.config.mds import MDSConfig
from hibert.runtime.export import load_encoder, read_export
from modeling.clusters import pack_clusters
from modeling.ranker import HibertRanker

RANKER_WEIGHTS = "ranker.safetensors"


RANKER_CONFIG = "ranker.json"


@torch.no_grad()
def score_clusters(model: torch.nn.Module, clusters: list[list[list[np.ndarray]]], device: torch.device | str,
                   max_tokens: int = 32768) -> list[np.ndarray]:
    """Ranker scores of every unit of every cluster (clusters batched up to `max_tokens`), in input order."""
    out: list[np.ndarray] = []
    batch: list[list[list[np.ndarray]]] = []
    tokens = 0

    def flush() -> None:
        if batch:
            packed = pack_clusters(batch).to(device)
            s = model(packed.units).float().cpu().numpy()
            counts = [len(c) for c in batch]
            out.extend(np.split(s, np.cumsum(counts)[:-1]))
            batch.clear()

    for c in clusters:
        n = sum(len(s) + 1 for u in c for s in u)
        if batch and tokens + n > max_tokens:
            flush()
            tokens = 0
        batch.append(c)
        tokens += n
    flush()
    return out


def load_ranker(export_dir: Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict]:
    """(ranker in eval mode, settings) from an export written by this task."""
    export_dir = Path(export_dir)
    enc, model_cfg, meta = read_export(export_dir)
    if not (export_dir / RANKER_WEIGHTS).is_file():
        raise FileNotFoundError(f"{export_dir} holds no ranker ({RANKER_WEIGHTS}): pass a model produced by "
                                "`hibert finetune finetune.task=ranker`")
    mds = MDSConfig.model_validate(json.loads((export_dir / RANKER_CONFIG).read_text())["mds"])
    model = HibertRanker(model_cfg, mds.ranker_pool)
    load_encoder(model.encoder, enc)
    missing, unexpected = model.load_state_dict(load_file(str(export_dir / RANKER_WEIGHTS)), strict=False)
    missing = [k for k in missing if not k.startswith("encoder.")]
    if missing or unexpected:
        raise ValueError(f"{export_dir}/{RANKER_WEIGHTS} does not fit the ranker: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    return model.to(device).eval(), {**meta, "mds": mds.model_dump(), "model": model_cfg.model_dump()}
