"""The abstractive export's files and its decoding settings read without loading any weights (generation.json,
the decoder's target positions in abstractive.json), with the rules that flags laid over them must keep: the
abstractive and multi-document heads' `Inference` (hibert/heads.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hibert.config.abstractive import DecoderConfig, GenerationConfig
from hibert.finetune.inference.flags import SettingError
from hibert.json_files import read_json_object, validated

DECODER_WEIGHTS = "decoder.safetensors"
DECODER_CONFIG = "abstractive.json"
GENERATION_CONFIG = "generation.json"


def stored_generation(export_dir: Path) -> GenerationConfig:
    """The decoding settings an abstractive (or mds) export was written with (generation.json; the defaults
    when it has none)."""
    path = Path(export_dir) / GENERATION_CONFIG
    return validated(GenerationConfig, read_json_object(path), path) if path.is_file() else GenerationConfig()


def decoder_max_positions(export_dir: Path) -> int:
    """The decoder's target positions (decoder.max_positions of abstractive.json)."""
    path = Path(export_dir) / DECODER_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{export_dir} holds no abstractive decoder ({DECODER_CONFIG})")
    settings = read_json_object(path)
    if "decoder" not in settings:
        raise ValueError(f"{path} has no 'decoder' section (a damaged export)")
    return validated(DecoderConfig, settings["decoder"], path).max_positions


def check_generation(given: dict[str, Any], base: GenerationConfig | None, export_dir: Path | None) -> None:
    """The decoding flags given (field -> value) against each other (`base` None: before any model), then
    against the export's own settings: the minimum against the maximum length wherever each comes from, and
    max_length + 1 target positions against the decoder's table. Raises `SettingError` naming the flag (or,
    for a setting of the export's own, the file)."""
    if base is None:
        if "min_length" in given and "max_length" in given and given["min_length"] > given["max_length"]:
            raise SettingError(f"--min-len {given['min_length']} is above --max-len {given['max_length']}: "
                               "the minimum summary length cannot exceed the maximum")
        return
    check_generation(given, None, None)
    low, high = given.get("min_length", base.min_length), given.get("max_length", base.max_length)
    if low > high:  # not both flags (checked above): one side is the model's generation.json
        if "min_length" in given:
            raise SettingError(f"--min-len {low} is above the model's maximum length {high} (generation.json); "
                               "pass --max-len too")
        raise SettingError(f"--max-len {high} is below the model's minimum length {low} (generation.json); "
                           "pass --min-len too")
    max_positions = decoder_max_positions(export_dir)
    if high + 1 > max_positions:
        what = f"--max-len {high}" if "max_length" in given else f"the model's generation.json max_length {high}"
        raise SettingError(f"{what}: the model's decoder has {max_positions} target positions (decoder."
                           f"max_positions in abstractive.json), so at most --max-len {max_positions - 1}")
