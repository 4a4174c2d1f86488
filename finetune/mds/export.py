"""The multi-document summarizer's export (the abstractive files + mds.json) and its loader (single process,
no DeepSpeed)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hibert.config.abstractive import DecoderConfig
from hibert.config.mds import MDSConfig
from hibert.finetune.abstractive.settings import (
    DECODER_CONFIG,
    DECODER_WEIGHTS,
)
from hibert.finetune.base.exports import load_head_export
from hibert.json_files import read_json_object
from hibert.modeling.mds import HibertMDS

if TYPE_CHECKING:
    from hibert.config.mds import MDSConfig


MDS_CONFIG = "mds.json"



def stored_mds_config(stored: dict[str, Any]) -> MDSConfig:
    """The `mds:` settings an export was trained with; one without `global_layer` predates the paper's
    per-head projections (eq. 16-19) and loads as the `v0` form it was trained with, one without
    `graph_weighting` predates eq. 25 and builds its unit graph as it was trained (`sublinear`), one without
    the structural switches predates Chowdhury et al.'s split, root term and decoder context (all off), one
    without `title_unit` read no title (MDSConfig.LEGACY)."""
    return MDSConfig.from_export(stored)


def stored_mds_settings(export_dir: Path) -> MDSConfig:
    """An mds export's `mds:` settings (mds.json), read without loading any weights."""
    path = Path(export_dir) / MDS_CONFIG
    stored = read_json_object(path)
    if not isinstance(stored, dict) or not isinstance(stored.get("mds"), dict):
        raise ValueError(f"{path} has no 'mds' section (a damaged export)")
    return stored_mds_config(stored["mds"])


def load_mds(export_dir: Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """(HibertMDS in eval mode on `device`, settings) from an export written by the mds task."""
    export_dir = Path(export_dir)
    settings: dict[str, Any] = {}

    def build(model_cfg):
        settings.update(read_json_object(export_dir / DECODER_CONFIG))
        settings["mds"] = stored_mds_config(read_json_object(export_dir / MDS_CONFIG)["mds"])
        return HibertMDS(model_cfg, DecoderConfig.model_validate(settings["decoder"]), settings["mds"])

    model, meta, model_cfg = load_head_export(
        export_dir, device, weights=DECODER_WEIGHTS, required=(DECODER_WEIGHTS, DECODER_CONFIG, MDS_CONFIG),
        build=build, missing=lambda d, name: f"{d} has no {name}: pass a model produced by "
                                             "`hibert finetune finetune.task=mds`")
    mds = settings.pop("mds")
    return model, {**meta, "decoder": settings, "mds": mds,
                   "model": model_cfg.model_dump()}
