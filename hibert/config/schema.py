"""The one config schema. Every command reads a `Config`; every run saves it resolved next to its outputs.

The core sections are fields here; the heads' own sections (the abstractive head's `decoder` and `generation`,
the multi-document heads' `mds`, a plugin's) are merged in from the head registry (hibert/heads.py) before the
first config is built, with the heads' cross-section rules: the schema names no head."""
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator
from pydantic.fields import FieldInfo

from hibert import heads
from hibert.config.base import Section
from hibert.config.data import DataConfig
from hibert.config.finetune import FinetuneConfig
from hibert.config.model import ModelConfig
from hibert.config.ops import RunConfig, SlurmConfig, TrackingConfig
from hibert.config.training import (
    CheckpointConfig,
    DeepSpeedConfig,
    ObjectiveConfig,
    OptimizerConfig,
    ScheduleConfig,
)


class Config(Section):
    run: RunConfig = Field(default_factory=RunConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)

    @model_validator(mode="after")
    def _cross_section(self) -> "Config":
        """Rules that span sections; each names the keys involved."""
        need = max(self.data.max_sentence_tokens + 1, self.data.max_doc_sentences)  # words + EOS; sentences
        if self.model.max_positions < need:
            raise ValueError(f"model.max_positions ({self.model.max_positions}) must cover "
                             f"data.max_sentence_tokens + 1 ({self.data.max_sentence_tokens + 1}) and "
                             f"data.max_doc_sentences ({self.data.max_doc_sentences})")
        ds = self.deepspeed
        if ds.offload_optimizer != "none" and ds.zero_stage == 0:
            raise ValueError("deepspeed.offload_optimizer needs deepspeed.zero_stage >= 1")
        if ds.offload_param != "none" and ds.zero_stage != 3:
            raise ValueError("deepspeed.offload_param needs deepspeed.zero_stage=3")
        for check in heads.config_checks():   # the heads' rules over their sections and the core ones
            check(self)
        if self.checkpoint.keep_best and self.schedule.eval_every == 0 and self.schedule.early_stop_patience:
            raise ValueError("schedule.early_stop_patience needs schedule.eval_every > 0 (evaluations during "
                             "training)")
        return self

    # Every way a Config is built first merges the heads' sections in (`with_head_sections`).
    def __init__(self, **data: Any) -> None:
        with_head_sections()
        super().__init__(**data)

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> "Config":
        with_head_sections()
        return super().model_validate(obj, **kwargs)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.run_dir / "checkpoints"


def with_head_sections() -> type[Config]:
    """`Config` with every registered head's config sections as fields (each defaulting to its model's
    defaults), added once: the registry loads on the first call."""
    new = {name: model for name, model in heads.config_sections().items() if name not in Config.model_fields}
    for name, model in new.items():
        Config.__pydantic_fields__[name] = FieldInfo.from_annotated_attribute(model, Field(default_factory=model))
    if new:
        Config.model_rebuild(force=True)
    return Config
