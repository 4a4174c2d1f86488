"""Operational sections: run identity, experiment tracking and Slurm resources."""
from typing import Literal

from pydantic import Field

from hibert.config.base import Section


class RunConfig(Section):
    name: str = "hibert"
    output_dir: str = "runs"               # each run writes under <output_dir>/<name>
    stage: Literal["open-domain", "in-domain", "finetune", "none"] = "none"
    init: str | None = None                # models:/name@alias, a local export dir, or None (random)
    seed: int = 1234


class TrackingConfig(Section):
    uri: str | None = None                 # None -> $MLFLOW_TRACKING_URI or sqlite:///<output_dir>/mlflow.db
    experiment: str = "hibert"
    registered_model: str = "hibert-encoder"
    register_model: bool = True
    peak_tflops: float | None = None       # per device; None -> guessed from the device name (MFU)


class SlurmConfig(Section):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "24:00:00"
    nodes: int = 1
    gpus_per_node: int = 8
    cpus_per_task: int = 8
    mem: str | None = None
    signal_grace_s: int = 120              # --signal=B:USR1@<grace>
    requeue: bool = True
    array_parallelism: int | None = None   # %N on prep job arrays
    container: str | None = None           # e.g. a pyxis --container-image
    setup: list[str] = Field(default_factory=list)  # module loads, venv activation...
    extra_sbatch: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
