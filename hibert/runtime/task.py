"""What a training job trains. The one training loop (`hibert.runtime.trainer.Trainer`) drives any Task:
masked-sentence pretraining (pretrain/) and every finetuning head (finetune/) — no second loop.

A task supplies: `build_model`, `make_item` (DataLoader workers: a pure function of its arguments), `loss`
(forward + additive statistics), `summarize` (statistics -> metrics), `model_config`; optionally
`evaluate` (validation metrics from an `EvalContext`; default: the loss statistics on the validation split),
`init_from` (what the task takes from the `run.init` export; default: its encoder), `param_groups`
(optimizer groups with their own lr scale and warmup), `registry_name`/`registry_alias`,
`write_export_extras` and `write_export_flavors`. See hibert/runtime/run.py for how a command runs a task."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hibert.runtime.export import InitModel, load_encoder


@dataclass
class ParamGroup:
    """Parameters that share an optimizer setting. `lr_scale` multiplies optimizer.lr; `warmup_steps`
    (None: schedule.warmup_steps) is this group's own warmup under the same decay rule. Freeze a group
    with lr_scale=0, never by toggling requires_grad (that changes what the optimizer and ZeRO hold)."""
    name: str
    params: list[torch.nn.Parameter]
    weight_decay: float
    lr_scale: float = 1.0
    warmup_steps: int | None = None


def decay_groups(named_params, weight_decay: float, prefix: str = "", **settings: Any) -> list[ParamGroup]:
    """Split parameters into weight-decayed matrices and undecayed biases/LayerNorm weights."""
    decay, no_decay = [], []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return [ParamGroup(f"{prefix}decay", decay, weight_decay, **settings),
            ParamGroup(f"{prefix}no_decay", no_decay, 0.0, **settings)]


@dataclass
class LoaderItem:
    """One micro-batch as it leaves a DataLoader worker: the model input plus CPU-side accounting."""
    batch: Any                         # a modeling batch with .to(device)
    real_tokens: int                   # tokens the model really processes (for tokens/s)
    flops: float                       # model FLOPs fwd+bwd on real tokens (for MFU)
    num_docs: int
    extra: dict[str, Any] = field(default_factory=dict)
    collate_s: float = 0.0             # worker time spent in make_item (set by the loader)

    def to(self, device: torch.device) -> "LoaderItem":
        self.batch = self.batch.to(device)
        return self

    def pin_memory(self) -> "LoaderItem":
        """Called by the DataLoader's pinning thread (pin_memory=True)."""
        self.batch = self.batch.pin_memory()
        return self


@dataclass
class EvalContext:
    """What `Task.evaluate` reads from the runtime (not the trainer): the engine and the device it runs on, whether
    this is rank 0, the validation split, and two collectives every rank calls alike:
    `items(data=None)` yields (micro-batch on the device, counted) over this rank's share of a split's batches
    (default: the validation split) with the model in eval mode and no gradients — ZeRO-3's forward is collective,
    so every rank runs as many forwards, and the padding ones (repeats of a real batch) come with counted=False;
    `all_sum(values)` sums a dict of floats over the ranks."""
    engine: Any
    device: torch.device
    is_main: bool
    valid_data: Any
    items: Callable[..., Iterator[tuple[LoaderItem, bool]]]
    all_sum: Callable[[dict[str, float]], dict[str, float]]


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

    def param_groups(self, model: torch.nn.Module, cfg) -> list[ParamGroup]:
        """Optimizer groups. Default: one lr and warmup for everything, no decay on biases and norms."""
        return decay_groups(model.named_parameters(), cfg.optimizer.weight_decay)

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

    def write_export_flavors(self, out_dir) -> None:
        """Files that describe the finished export to other tools (a finetuned head's MLflow pyfunc
        `MLmodel`), written after every weight and settings file is in place."""

    def registry_notes(self, out_dir) -> tuple[list[str], dict[str, str]]:
        """(sentences, tags) the registered version carries about the finished export beyond its provenance:
        what a user of the model must know (a decoder that cannot write yet, the selection it is served with).
        In the version's description and tags."""
        return [], {}

    def init_from(self, model: torch.nn.Module, init: InitModel | None) -> None:
        """Start the model `build_model` just made from `run.init` (None: a random start). The runtime calls it
        once, right after `build_model`, for every task. Default: the export's encoder weights into `model.encoder`;
        a task that takes more of the export (e.g. a pretraining decoder) overrides it."""
        if init is not None:
            load_encoder(model.encoder, init.state)

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        """Validation metrics. Default: the task's loss statistics summed over the validation split."""
        sums: dict[str, float] = {k: 0.0 for k in self.stat_keys}
        for item, counted in ctx.items():
            _, stats = self.loss(ctx.engine, item)
            if counted:
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        return self.summarize(ctx.all_sum(sums), "valid_")


class TokenNLLTask(Task):
    """A task whose model returns (loss, nll_sum, num_target_tokens) for a batch of target tokens: loss
    statistics summed across ranks, reported as mean NLL and perplexity (pretraining, abstractive)."""

    stat_keys = ("nll_sum", "num_target_tokens")

    def forward_kwargs(self) -> dict[str, Any]:
        return {}

    def loss(self, engine, item: LoaderItem):
        out = engine(item.batch, **self.forward_kwargs())
        stats = {"nll_sum": out.nll_sum.detach().double(),
                 "num_target_tokens": torch.as_tensor(out.num_target_tokens, dtype=torch.float64)}
        if "coverage_sum" in self.stat_keys:  # a model with See et al.'s coverage loss reports it too
            stats["coverage_sum"] = out.coverage_loss.double() * out.num_target_tokens
        return out.loss, stats

    def summarize(self, sums: dict[str, float], prefix: str) -> dict[str, float]:
        n = sums.get("num_target_tokens", 0.0)
        if n <= 0:
            return {}
        nll = sums["nll_sum"] / n
        out = {f"{prefix}loss": nll, f"{prefix}ppl": math.exp(min(nll, 50.0))}
        if "coverage_sum" in sums:
            out[f"{prefix}coverage_loss"] = sums["coverage_sum"] / n
        return out
