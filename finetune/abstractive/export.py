"""The abstractive export's loader (encoder + decoder.safetensors + abstractive.json + generation.json; single
process, no DeepSpeed). Its settings files alone, without weights: finetune/abstractive/settings.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hibert.config.abstractive import DecoderConfig
from hibert.finetune.abstractive.settings import DECODER_CONFIG, DECODER_WEIGHTS
from hibert.finetune.base.exports import load_head_export
from hibert.json_files import read_json_object
from hibert.modeling.abstractive import HibertAbstractive


def load_abstractive(export_dir: Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model in eval mode on `device`, settings) from an export written by the abstractive task."""
    export_dir = Path(export_dir)
    settings = {}

    def build(model_cfg):
        settings.update(read_json_object(export_dir / DECODER_CONFIG))
        return HibertAbstractive(model_cfg, DecoderConfig.model_validate(settings["decoder"]))

    model, meta, model_cfg = load_head_export(
        export_dir, device, weights=DECODER_WEIGHTS, required=(DECODER_WEIGHTS, DECODER_CONFIG), build=build,
        missing=lambda d, name: f"{d} holds no abstractive decoder ({DECODER_WEIGHTS}, {DECODER_CONFIG}): pass a "
                                "model produced by `hibert finetune finetune.task=abstractive`")
    return model, {**meta, "decoder": settings,
                   "model": model_cfg.model_dump()}
