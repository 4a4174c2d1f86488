"""Training sections shared by pretraining and finetuning: objective, optimizer, schedule, deepspeed, checkpoint."""
from typing import Any, Literal

from pydantic import Field, model_validator

from hibert.config.base import Section


class ObjectiveConfig(Section):
    kind: Literal["masked_sentence", "extractive"] = "masked_sentence"
    # masked-sentence pretraining (HIBERT §3.2)
    select_ratio: float = 0.15
    min_selected: int = 1
    max_selected: int | None = None
    mask_prob: float = 0.8
    keep_prob: float = 0.1
    random_prob: float = 0.1
    label_smoothing: float = 0.0
    # extractive finetuning (HIBERT §3.3)
    top_k: int = 3
    trigram_blocking: bool = False

    @model_validator(mode="after")
    def _check(self) -> "ObjectiveConfig":
        total = self.mask_prob + self.keep_prob + self.random_prob
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"mask_prob + keep_prob + random_prob must be 1, got {total}")
        if not 0.0 < self.select_ratio <= 1.0:
            raise ValueError("select_ratio must be in (0, 1]")
        return self


class OptimizerConfig(Section):
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0


class ScheduleConfig(Section):
    warmup_steps: int = 10_000
    decay: Literal["inverse_sqrt", "linear", "constant"] = "inverse_sqrt"
    max_steps: int | None = None           # None -> epochs decide
    epochs: int = 1
    batch_tokens: int = 8192               # real tokens per micro-batch per rank
    max_docs_per_batch: int = 256
    grad_accum: int = 1
    log_every: int = 10
    eval_every: int = 1000
    eval_batches: int | None = None        # None -> the whole validation split
    early_stop_patience: int | None = None  # evaluations without improvement before stopping
    seed: int = 1234


class DeepSpeedConfig(Section):
    zero_stage: Literal[0, 1, 2, 3] = 1
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    offload_optimizer: Literal["none", "cpu"] = "none"
    offload_param: Literal["none", "cpu"] = "none"
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 50_000_000
    stage3_gather_16bit_weights_on_model_save: bool = False
    extra: dict[str, Any] = Field(default_factory=dict)  # merged last into the DeepSpeed JSON


class CheckpointConfig(Section):
    dir: str | None = None                 # None -> <run dir>/checkpoints
    every_steps: int = 1000
    keep_last: int = 3
    resume: str = "auto"                   # auto | never | <path to a checkpoint tag>
    # Model selection: keep the weights of the best `keep_best` evaluations (by the task's validation
    # metric) and export their average (1 = export the single best). 0 = export the last weights.
    keep_best: int = 1
