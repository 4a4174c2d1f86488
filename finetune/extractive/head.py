"""The extractive head's parts (registered in spec.py): sentence labelling on documents (HIBERT §3.3)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.finetune.extractive.task import ExtractiveTask
from hibert.heads import HeadError

if TYPE_CHECKING:  # the runtime brings DeepSpeed (~2.5 s); summarize and evaluate never need it
    from hibert.runtime.run import RunInputs


def build_task(cfg: Config, inputs: RunInputs, model_cfg: ModelConfig) -> ExtractiveTask:
    if inputs.train.is_clusters:
        raise HeadError(f"hibert finetune: finetune.task=extractive reads documents; {cfg.data.dataset_dir} "
                        "holds clusters (use finetune.task=ranker, mds or abstractive)")
    return ExtractiveTask(cfg, model_cfg)
