"""The multi-document summarizer's parts (registered in spec.py; Liu & Lapata 2019 on HIBERT): ranked units of a cluster ->
local and global layers -> decoder."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hibert.config import Config
from hibert.config.abstractive import GenerationConfig
from hibert.config.model import ModelConfig
from hibert.finetune.abstractive.evaluate import ClusterEvaluation
from hibert.finetune.abstractive.head import check_has_training_data, use_ranked_clusters
from hibert.finetune.mds.task import MDSTask
from hibert.finetune.ranker.head import need_clusters
from hibert.finetune.settings import EvalSettings
from hibert.heads import EvalOutcome, HeadError

if TYPE_CHECKING:  # the runtime brings DeepSpeed (~2.5 s); summarize and evaluate never need it
    from hibert.runtime.run import RunInputs


def build_task(cfg: Config, inputs: RunInputs, model_cfg: ModelConfig) -> MDSTask:
    need_clusters(cfg, inputs)
    use_ranked_clusters(cfg, inputs)
    check_has_training_data(cfg, inputs)
    task = MDSTask(cfg, model_cfg)
    task.reads_clusters = True
    return task


def evaluate(cfg: Config, settings: EvalSettings, local: Path, ref: str, clusters: bool,
             generation: GenerationConfig) -> EvalOutcome:
    if not clusters:
        raise HeadError(f"hibert evaluate: {ref} is a multi-document model; {cfg.data.dataset_dir} holds "
                        "documents, not clusters")
    return ClusterEvaluation(cfg, settings, local, ref, generation, mds=True).run()
