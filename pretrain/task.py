"""What a training job trains. The one training loop (`pretrain.trainer.Trainer`) drives any Task:
masked-sentence pretraining here, extractive finetuning in finetune/ — no second loop."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class LoaderItem:
    """One micro-batch as it leaves a DataLoader worker: the model input plus CPU-side accounting."""
    batch: Any                         # a modeling batch with .to(device)
    real_tokens: int                   # tokens the model really processes (for tokens/s)
    flops: float                       # model FLOPs fwd+bwd on real tokens (for MFU)
    num_docs: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to(self, device: torch.device) -> "LoaderItem":
        self.batch = self.batch.to(device)
        return self


class Task(ABC):
    name: str = "task"
    eval_metric: str = "valid_loss"    # the metric early stopping and model selection watch
    eval_mode: str = "min"             # "min" or "max"

    @abstractmethod
    def build_model(self) -> torch.nn.Module: ...

    @abstractmethod
    def make_item(self, dataset, doc_indices: np.ndarray, epoch: int) -> LoaderItem:
        """Runs in DataLoader workers; must be a pure function of its arguments (and the task's seed)."""

    @abstractmethod
    def loss(self, engine, item: LoaderItem) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward; returns the loss to backpropagate and additive statistics (summed across ranks)."""

    @abstractmethod
    def summarize(self, sums: dict[str, float], prefix: str) -> dict[str, float]:
        """Turn summed statistics into reported metrics (e.g. perplexity)."""

    stat_keys: tuple[str, ...] = ()    # statistics every rank reports (so all-reduces line up)

    def model_config(self):
        """The `model:` config the exported encoder was built with (vocab size filled in)."""
        raise NotImplementedError

    def registry_name(self, cfg) -> str:
        return cfg.tracking.registered_model

    def registry_alias(self, cfg) -> str | None:
        if cfg.tracking.alias:
            return cfg.tracking.alias
        return cfg.run.stage if cfg.run.stage != "none" else None

    def write_export_extras(self, out_dir, full_state: dict[str, torch.Tensor]) -> None:
        """Task-specific files next to the encoder export (e.g. a finetuned head), from the full
        fp32 state dict of the trained module."""

    def evaluate(self, trainer) -> dict[str, float]:
        """Validation metrics. Default: the task's loss statistics summed over the validation split."""
        sums: dict[str, float] = {k: 0.0 for k in self.stat_keys}
        for item, counted in trainer.valid_items():
            _, stats = self.loss(trainer.engine, item)
            if counted:
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        return self.summarize(trainer.all_sum(sums), "valid_")
