"""Training sections shared by pretraining and finetuning: objective, optimizer, schedule, deepspeed, checkpoint."""
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from hibert.config.base import Section


class ObjectiveConfig(Section):
    # the pretraining objective; a finetuning run's head is `finetune.task`, not repeated here
    kind: Literal["masked_sentence"] = "masked_sentence"
    # masked-sentence pretraining (HIBERT §3.2)
    select_ratio: float = Field(0.15, gt=0.0, le=1.0)
    min_selected: int = Field(1, ge=0)
    max_selected: int | None = Field(None, ge=1)
    mask_prob: float = Field(0.8, ge=0.0, le=1.0)
    keep_prob: float = Field(0.1, ge=0.0, le=1.0)
    random_prob: float = Field(0.1, ge=0.0, le=1.0)
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    # extractive finetuning (HIBERT §3.3)
    top_k: int = Field(3, ge=1)
    trigram_blocking: bool = False
    # at export, k (1-5) and trigram blocking are tuned on the validation split with the exported weights and
    # written to the export's extractive.json: the one selection evaluated, summarized and served
    tune_selection: bool = True
    tune_documents: int = Field(2000, ge=1)   # the first N validation documents (ROUGE is scored 10 times)

    @field_validator("kind", mode="before")
    @classmethod
    def _legacy_head_kind(cls, v: Any) -> Any:
        # configs written before finetune.task was the one place naming a head set objective.kind to it
        return "masked_sentence" if v in ("extractive", "abstractive", "ranker", "mds") else v

    @model_validator(mode="after")
    def _check(self) -> "ObjectiveConfig":
        total = self.mask_prob + self.keep_prob + self.random_prob
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"objective.mask_prob + keep_prob + random_prob must be 1, got {total}")
        if self.max_selected is not None and self.max_selected < self.min_selected:
            raise ValueError(f"objective.max_selected ({self.max_selected}) must be >= objective.min_selected "
                             f"({self.min_selected})")
        return self


Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


class OptimizerConfig(Section):
    lr: float = Field(1e-4, ge=0.0, le=10.0)     # 0: weights stay as loaded (checks, frozen baselines)
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    grad_clip: float = Field(1.0, ge=0.0)     # 0 = no clipping


class ScheduleConfig(Section):
    warmup_steps: int = Field(10_000, ge=0)
    decay: Literal["inverse_sqrt", "linear", "constant"] = "inverse_sqrt"
    max_steps: int | None = Field(None, ge=1)  # None -> epochs decide
    epochs: int = Field(1, ge=1)
    batch_tokens: int = Field(8192, ge=1)  # real tokens per micro-batch per rank
    max_docs_per_batch: int = Field(256, ge=1)
    grad_accum: int = Field(1, ge=1)
    # micro-batches per optimizer step over all ranks: the global batch, kept on any world size (accumulation is
    # derived: global_batch / ranks). Unset: the resumed checkpoint's, else ranks x grad_accum at the first start
    # (hibert/runtime/global_batch.py)
    global_batch: int | None = Field(None, ge=1)
    log_every: int = Field(10, ge=1)
    eval_every: int = Field(1000, ge=0)    # 0 = evaluate only at the end
    eval_batches: int | None = Field(None, ge=1)  # None -> the whole validation split
    early_stop_patience: int | None = Field(None, ge=1)  # evaluations without improvement before stopping
    seed: int = Field(1234, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "ScheduleConfig":
        if self.decay == "linear" and self.max_steps is None:
            raise ValueError("schedule.decay=linear needs a horizon: set schedule.max_steps")
        if self.max_steps is not None and self.warmup_steps >= self.max_steps and self.decay == "linear":
            raise ValueError(f"schedule.warmup_steps ({self.warmup_steps}) must be < schedule.max_steps "
                             f"({self.max_steps}) for linear decay")
        return self


class DeepSpeedConfig(Section):
    zero_stage: Literal[0, 1, 2, 3] = 1
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    offload_optimizer: Literal["none", "cpu"] = "none"
    offload_param: Literal["none", "cpu"] = "none"
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = Field(50_000_000, ge=1)
    stage3_gather_16bit_weights_on_model_save: bool = False
    # bf16: skip a step whose gradients are not finite. DeepSpeed's check reads a flag back from the device at
    # every step (a host sync that stops the host queueing the next step's kernels); off, a non-finite gradient
    # reaches the weights and the step log's loss and grad_norm show it. fp16 always checks (its loss scaling
    # needs it); fp32 never does.
    check_finite_grads: bool = True
    # torch.compile each Transformer layer (as torchtitan compiles each block); off until a GPU run measures it
    # faster than eager (benchmarks/device_suite.sh step 2 runs both)
    torch_compile: bool = False
    extra: dict[str, Any] = Field(default_factory=dict)  # merged last into the DeepSpeed JSON

    @field_validator("extra")
    @classmethod
    def _check_extra(cls, extra: dict[str, Any]) -> dict[str, Any]:
        """The keys the runtime derives itself must not be overridden behind its back: the loader makes
        one token-budget micro-batch per "sample", and checkpoints record the accumulation."""
        for key, ours in _DERIVED_DS_KEYS.items():
            if key in extra:
                raise ValueError(f"deepspeed.extra.{key} is set by the platform; use {ours} instead")
        zero = extra.get("zero_optimization", {})
        if not isinstance(zero, dict):
            raise ValueError("deepspeed.extra.zero_optimization must be a mapping")
        if "stage" in zero and zero["stage"] not in (0, 1, 2, 3):
            raise ValueError(f"deepspeed.extra.zero_optimization.stage must be 0, 1, 2 or 3, got {zero['stage']!r} "
                             "(prefer deepspeed.zero_stage)")
        # a checkpoint is complete (COMPLETE.json, then older ones pruned) when save_checkpoint returns: the
        # asynchronous engines, which still write after it returns, would mark partial checkpoints complete
        checkpoint = extra.get("checkpoint")
        writer = checkpoint.get("writer") if isinstance(checkpoint, dict) else None
        if isinstance(writer, dict) and writer.get("decoupled"):
            raise ValueError("deepspeed.extra.checkpoint.writer.decoupled is not supported: checkpoints are marked "
                             "complete when DeepSpeed's save returns, and the decoupled writer is still writing then")
        if isinstance(extra.get("datastates_ckpt"), dict) and extra["datastates_ckpt"].get("enabled"):
            raise ValueError("deepspeed.extra.datastates_ckpt is not supported: an asynchronous checkpoint would be "
                             "marked complete before it is written")
        for k in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size"):
            v = zero.get(k)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"deepspeed.extra.zero_optimization.{k} must be a positive number, got {v!r}")
        return extra


_DERIVED_DS_KEYS = {
    "train_batch_size": "schedule.batch_tokens and schedule.global_batch",
    "train_micro_batch_size_per_gpu": "schedule.batch_tokens",
    "gradient_accumulation_steps": "schedule.grad_accum (or schedule.global_batch)",
    "gradient_clipping": "optimizer.grad_clip",
}


class CheckpointConfig(Section):
    dir: str | None = None                 # None -> <run dir>/checkpoints
    every_steps: int = Field(1000, ge=0)   # 0 = only at the end and on preemption
    keep_last: int = Field(3, ge=1)        # complete checkpoints kept (0 would delete each one once written)
    resume: str = Field("auto", min_length=1)  # auto | never | <path to a checkpoint tag>
    # Model selection: keep the weights of the best `keep_best` evaluations (by the task's validation
    # metric) and export their average (1 = export the single best). 0 = export the last weights.
    keep_best: int = Field(1, ge=0)
