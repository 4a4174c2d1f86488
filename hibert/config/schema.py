"""The one config schema. Every command reads a `Config`; every run saves it resolved next to its outputs."""
from pathlib import Path

from pydantic import Field, model_validator

from hibert.config.abstractive import DecoderConfig, GenerationConfig
from hibert.config.base import Section
from hibert.config.data import DataConfig
from hibert.config.finetune import FinetuneConfig
from hibert.config.mds import MDSConfig
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
    decoder: DecoderConfig = Field(default_factory=DecoderConfig)        # abstractive head
    generation: GenerationConfig = Field(default_factory=GenerationConfig)  # its beam search
    mds: MDSConfig = Field(default_factory=MDSConfig)                    # multi-document ranker + global layers
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
        heads = self.decoder.heads or self.model.heads
        if self.model.hidden % heads:
            raise ValueError(f"decoder.heads ({heads}) must divide model.hidden ({self.model.hidden})")
        if self.model.hidden % (self.mds.global_heads or self.model.heads):
            raise ValueError(f"mds.global_heads ({self.mds.global_heads}) must divide model.hidden "
                             f"({self.model.hidden})")
        if self.finetune.max_target_tokens + 1 > self.decoder.max_positions:
            raise ValueError(f"finetune.max_target_tokens + 1 ({self.finetune.max_target_tokens + 1}) must fit "
                             f"decoder.max_positions ({self.decoder.max_positions})")
        if self.generation.max_length + 1 > self.decoder.max_positions:
            raise ValueError(f"generation.max_length + 1 ({self.generation.max_length + 1}) must fit "
                             f"decoder.max_positions ({self.decoder.max_positions})")
        if self.checkpoint.keep_best and self.schedule.eval_every == 0 and self.schedule.early_stop_patience:
            raise ValueError("schedule.early_stop_patience needs schedule.eval_every > 0 (evaluations during "
                             "training)")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.run_dir / "checkpoints"
