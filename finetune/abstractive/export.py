"""The abstractive export (encoder + decoder.safetensors + abstractive.json + generation.json) and its
loader (single process, no DeepSpeed); the decoding settings of an export read without loading weights, so
that flags that cannot work fail before the model loads."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hibert.config.abstractive import DecoderConfig, GenerationConfig
from hibert.finetune.base.exports import load_head_export, read_json, validated
from hibert.finetune.base.generation import generation_from_args
from hibert.finetune.base.settings import DecodingFlags
from hibert.modeling.abstractive import HibertAbstractive


def load_abstractive(export_dir: Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model in eval mode on `device`, settings) from an export written by the abstractive task."""
    export_dir = Path(export_dir)
    settings = {}

    def build(model_cfg):
        settings.update(read_json(export_dir / DECODER_CONFIG))
        return HibertAbstractive(model_cfg, DecoderConfig.model_validate(settings["decoder"]))

    model, meta, model_cfg = load_head_export(
        export_dir, device, weights=DECODER_WEIGHTS, required=(DECODER_WEIGHTS, DECODER_CONFIG), build=build,
        missing=lambda d, name: f"{d} holds no abstractive decoder ({DECODER_WEIGHTS}, {DECODER_CONFIG}): pass a "
                                "model produced by `hibert finetune finetune.task=abstractive`")
    return model, {**meta, "generation": stored_generation(export_dir), "decoder": settings,
                   "model": model_cfg.model_dump()}


def stored_generation(export_dir: Path):
    """The decoding settings an abstractive (or mds) export was written with (generation.json; the defaults
    when it has none) — read without loading any weights."""
    path = Path(export_dir) / GENERATION_CONFIG
    return validated(GenerationConfig, read_json(path), path) if path.is_file() else GenerationConfig()


def decoder_max_positions(export_dir: Path) -> int:
    """The decoder's target positions (decoder.max_positions of abstractive.json), without loading weights."""
    path = Path(export_dir) / DECODER_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{export_dir} holds no abstractive decoder ({DECODER_CONFIG})")
    settings = read_json(path)
    if not isinstance(settings, dict) or "decoder" not in settings:
        raise ValueError(f"{path} has no 'decoder' section (a damaged export)")
    return validated(DecoderConfig, settings["decoder"], path).max_positions


def generation_for_export(export_dir: Path, args: DecodingFlags) -> GenerationConfig:
    """`generation_from_args` for an abstractive (or mds) export, read from its generation.json and
    abstractive.json without loading any weights: decoding flags that cannot work fail before the model
    loads."""
    return generation_from_args(stored_generation(export_dir), args, decoder_max_positions(export_dir))



DECODER_WEIGHTS = "decoder.safetensors"


DECODER_CONFIG = "abstractive.json"


GENERATION_CONFIG = "generation.json"
