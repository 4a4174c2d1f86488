"""Reading an export: the one loader of a head's export (encoder + the head's files); its JSON settings files
are read by hibert/json_files.py."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hibert.config.model import ModelConfig
from hibert.runtime.export import load_encoder, read_export, read_weights


def load_head_export(export_dir: Path, device: torch.device | str, *, weights: str, required: tuple[str, ...],
                     build: Callable[[ModelConfig], torch.nn.Module], missing: Callable[[Path, str], str],
                     into: Callable[[torch.nn.Module], torch.nn.Module] = lambda model: model,
                     ) -> tuple[torch.nn.Module, dict[str, Any], ModelConfig]:
    """The one export loader every head uses: the encoder export (encoder.safetensors, model.json,
    export.json), then the head's `required` files (`missing(dir, name)` words the error for a missing one),
    the model `build` makes from the encoder's config (it may read those files), the encoder's weights, and
    the head's `weights` loaded into `into(model)`: every key of that file must fit, and nothing but the
    encoder's own keys (which encoder.safetensors holds) may be left out. Returns (model in eval mode on
    `device`, export.json, the encoder's model config)."""
    export_dir = Path(export_dir)
    enc, model_cfg, meta = read_export(export_dir)
    for name in required:
        if not (export_dir / name).is_file():
            raise FileNotFoundError(missing(export_dir, name))
    model = build(model_cfg)
    load_encoder(model.encoder, enc)
    absent, unexpected = into(model).load_state_dict(read_weights(export_dir / weights), strict=False)
    absent = [k for k in absent if not k.startswith("encoder.")]
    if absent or unexpected:
        raise ValueError(f"{export_dir}/{weights} does not fit the model: missing {absent[:5]}, "
                         f"unexpected {unexpected[:5]}")
    return model.to(device).eval(), meta, model_cfg
