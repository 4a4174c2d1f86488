"""The one config schema. Every command reads a `Config`; every run saves it resolved next to its outputs."""
from pathlib import Path

from pydantic import Field

from hibert.config.base import Section
from hibert.config.data import DataConfig
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
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.run_dir / "checkpoints"
