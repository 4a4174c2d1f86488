"""What every head's `Task` shares: an encoder under a head (the runtime loads `run.init`'s into `model.encoder`),
the registered model its head spec names, the `finetuned` alias, and the encoder/head optimizer groups."""
from __future__ import annotations

from pathlib import Path

import torch

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.finetune.inference.fluency import fluency_note, recorded_ppl
from hibert.finetune.serving.flavor import write_pyfunc_flavor
from hibert.json_files import read_json_object
from hibert.heads import get_head
from hibert.runtime.task import ParamGroup, decay_groups


class EncoderHead:
    """Mixed into a head's Task (before `hibert.runtime.task.Task`): `name` is the head's registered name."""
    name: str
    cfg: Config
    model_cfg: ModelConfig

    def model_config(self) -> ModelConfig:
        return self.model_cfg

    def registry_name(self, cfg: Config) -> str:
        return get_head(self.name).registered_model

    def registry_alias(self, cfg: Config) -> str | None:
        return cfg.tracking.alias or "finetuned"  # MLflow reserves "latest"

    def write_export_flavors(self, out_dir) -> None:
        """A head that summarizes is also an MLflow pyfunc model (finetune/serving/flavor.py)."""

        write_pyfunc_flavor(out_dir)

    def registry_notes(self, out_dir) -> tuple[list[str], dict[str, str]]:
        """A decoding head's fluency (finetune/inference/fluency.py): the "cannot write yet" state belongs to
        the registered version (tag `writes`, and the note in its description), not only to a terminal line."""
        if not get_head(self.name).decodes:
            return [], {}
        ppl = recorded_ppl(read_json_object(Path(out_dir) / "export.json"))
        note = fluency_note(out_dir)
        writes = "unknown" if ppl is None else ("no" if note else "yes")
        return ([note] if note else []), {"writes": writes}


def encoder_and_head_groups(model: torch.nn.Module, cfg: Config, head_prefix: str) -> list[ParamGroup]:
    """The encoder at optimizer.lr x finetune.encoder_lr_scale with finetune.encoder_warmup_steps; the rest
    (head, decoder, global layers) at optimizer.lr."""
    ft, wd = cfg.finetune, cfg.optimizer.weight_decay
    enc = [(n, p) for n, p in model.named_parameters() if n.startswith("encoder.")]
    rest = [(n, p) for n, p in model.named_parameters() if not n.startswith("encoder.")]
    return (decay_groups(enc, wd, "encoder.", lr_scale=ft.encoder_lr_scale, warmup_steps=ft.encoder_warmup_steps)
            + decay_groups(rest, wd, head_prefix))
