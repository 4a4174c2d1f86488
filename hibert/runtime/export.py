"""Export: consolidate (ZeRO-partitioned) weights into plain safetensors + model config + tokenizer.

An export directory is the one hand-off format between stages and to finetuning:
    encoder.safetensors   fp32 encoder weights (master weights, gathered from every ZeRO partition)
    model.json            the `model:` config section (with the real vocab size)
    tokenizer.model       the SentencePiece model the encoder was trained with
    export.json           provenance: stage, step, dataset manifest hash, config hash, git commit, init; the
                          steps model selection kept and what they scored (`metrics`: the exported weights'
                          own evaluation; `final_metrics`: the last step's; `selected_metrics`: each kept one's)
It is logged as an MLflow artifact dir and registered, so `models:/hibert-encoder@in-domain` resolves to it.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from pydantic import ValidationError
from safetensors.torch import load_file, save_file

from hibert.config.load import format_validation_error
from hibert.config.model import ModelConfig
from hibert.errors import UserError
from hibert.hashing import file_sha256
from hibert.json_files import DAMAGED, read_json_object

WEIGHTS = "encoder.safetensors"
TOKENIZER = "tokenizer.model"


@dataclass
class InitModel:
    """What `run.init` resolved to: an export directory's weights, model config and provenance."""
    state: dict[str, torch.Tensor]   # encoder weights (fp32 tensors)
    model_cfg: ModelConfig
    meta: dict[str, Any]             # export.json
    local_dir: Path


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file; a missing, truncated or foreign one is one `UserError` line naming it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} is missing: {DAMAGED}")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors' SafetensorError, OSError, ...: the file is not what it should be
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise UserError(f"{path} is damaged or not a safetensors file ({reason}): {DAMAGED}") from None


MAX_TOKENIZER_BYTES = 64 << 20


def check_tokenizer(export_dir: Path, meta: dict[str, Any]) -> None:
    """The export's tokenizer.model is the one it was trained with: the sha256 export.json recorded (a deleted,
    replaced or corrupted tokenizer would otherwise summarize garbage or crash mid-beam)."""
    tok = meta.get("data", {}).get("tokenizer", {}) if isinstance(meta.get("data"), dict) else {}
    want = tok.get("sha256") if isinstance(tok, dict) else None
    path = Path(export_dir) / TOKENIZER
    if not path.is_file():
        if want:
            raise UserError(f"{path} is missing (the model was trained with tokenizer sha256 {want[:12]}...): "
                            f"{DAMAGED}")
        return
    if path.stat().st_size > MAX_TOKENIZER_BYTES:   # a tokenizer is a few hundred KB; this is something else
        raise UserError(f"{path}: {path.stat().st_size:,} bytes, not a SentencePiece model (they are well under "
                        f"{MAX_TOKENIZER_BYTES >> 20} MiB): {DAMAGED}")
    got = file_sha256(path) if want else None
    if want and got != want:
        raise UserError(f"{path} is not the tokenizer this model was trained with (sha256 {got[:12]}... "
                        f"!= {want[:12]}... recorded in export.json): {DAMAGED}")


def gather_fp32_state_dict(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """Collective: full fp32 tensors of `module`'s parameters under `prefix` (complete on rank 0).

    Uses DeepSpeed's safe_get_full_fp32_param (the optimizer's fp32 master copy, gathered across ZeRO
    partitions); falls back to the parameter itself when DeepSpeed keeps no separate master copy.
    Tied parameters are exported once per name, as nn.Module.state_dict would.
    """
    from deepspeed.utils import safe_get_full_fp32_param  # lazy: ~2.5 s, which an export's readers never need

    out: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        full = safe_get_full_fp32_param(p)
        if full is None:
            full = p.detach()
        if name.startswith(prefix):
            out[name[len(prefix):]] = full.detach().float().cpu().clone()
    non_persistent = {f"{m}.{b}" if m else b for m, sub in module.named_modules()
                      for b in getattr(sub, "_non_persistent_buffers_set", ())}
    for name, b in module.named_buffers():
        if name.startswith(prefix) and b is not None and name not in non_persistent:
            out.setdefault(name[len(prefix):], b.detach().cpu().clone())
    if dist.is_initialized():
        dist.barrier()
    return out


def write_export(out_dir: Path, encoder_state: dict[str, torch.Tensor], model_cfg: ModelConfig,
                 tokenizer: Path | None, meta: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    # safetensors refuses tensors sharing storage; tied weights were already de-duplicated by name
    save_file({k: v.contiguous() for k, v in encoder_state.items()}, str(out_dir / WEIGHTS))
    (out_dir / "model.json").write_text(json.dumps(model_cfg.model_dump(mode="json"), indent=1))
    if tokenizer is not None and Path(tokenizer).is_file():
        shutil.copy2(tokenizer, out_dir / "tokenizer.model")
    (out_dir / "export.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return out_dir


def read_export(export_dir: Path) -> tuple[dict[str, torch.Tensor], ModelConfig, dict[str, Any]]:
    """(encoder weights, model config, export.json) of an export; every damaged part is one `UserError` line
    naming the file: weights, model.json, export.json, and the tokenizer against its recorded sha256."""
    export_dir = Path(export_dir)
    weights = export_dir / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{export_dir} is not an encoder export (no {WEIGHTS})")

    model_path = export_dir / "model.json"
    try:
        cfg = ModelConfig.model_validate(read_json_object(model_path))
    except ValidationError as e:
        raise UserError(f"{format_validation_error(e, str(model_path))}: {DAMAGED}") from None
    meta_path = export_dir / "export.json"
    meta = read_json_object(meta_path) if meta_path.exists() else {}
    check_tokenizer(export_dir, meta)
    check_weights_fit(weights, cfg, model_path)
    return read_weights(weights), cfg, meta


def check_weights_fit(weights: Path, cfg: ModelConfig, model_path: Path) -> None:
    """The tensors the safetensors header lists against the encoder `cfg` describes, built on the meta device
    (no memory): a model.json that does not match its weights is one line before anything is allocated, not
    gigabytes of parameters or an allocator traceback."""
    from safetensors import safe_open

    from hibert.modeling.encoder import HibertEncoder   # lazy: the model code, only to read its shapes

    try:
        with safe_open(str(weights), "pt") as f:
            header = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: a damaged header
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise UserError(f"{weights} is damaged or not a safetensors file ({reason}): {DAMAGED}") from None
    with torch.device("meta"):
        own = {k: tuple(v.shape) for k, v in HibertEncoder(cfg).state_dict().items()}
    if header != own:
        odd = sorted(k for k in own.keys() | header.keys() if own.get(k) != header.get(k))
        shown = ", ".join(f"{k}: model.json {own.get(k)} vs weights {header.get(k)}" for k in odd[:3])
        raise UserError(f"{model_path} does not describe {weights} ({len(odd)} tensor(s) differ: {shown}): "
                        f"{DAMAGED}")


def load_encoder(encoder: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Strict load with a readable error (a size mismatch usually means another tokenizer or size)."""
    own = encoder.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k}: export {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own.keys() & state.keys() if own[k].shape != state[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(f"encoder weights do not fit the model: missing={missing[:5]} "
                         f"unexpected={unexpected[:5]} shape mismatches={shapes[:5]}")
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(state[k].to(v.dtype))
