"""The abstractive head's parts (registered in spec.py): HIBERT encoder + Transformer decoder on documents (the first chunk of
each), or — on a cluster dataset — the flat multi-document baseline reading the ranked units back to back."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.finetune.abstractive.data import FirstChunks
from hibert.finetune.abstractive.task import AbstractiveTask
from hibert.finetune.ranker.ranking import ranked_view
from hibert.heads import HeadError

if TYPE_CHECKING:  # the runtime brings DeepSpeed (~2.5 s); summarize and evaluate never need it
    from hibert.runtime.run import RunInputs

log = logging.getLogger("hibert")


def use_ranked_clusters(cfg: Config, inputs: RunInputs) -> None:
    """Both splits of a cluster dataset as ranked units cut to the budget (the flat baseline and mds)."""
    inputs.train, inputs.valid = (ranked_view(cfg, inputs.train, inputs.rt, reuse=True),
                                  ranked_view(cfg, inputs.valid, inputs.rt, reuse=True))
    if inputs.rt.is_main:
        log.info("%s: %d train / %d valid clusters (%d / %d without a summary left out)%s, units ranked by "
                 "%s, <= %d tokens", cfg.finetune.task, len(inputs.train), len(inputs.valid),
                 inputs.train.skipped_no_summary, inputs.valid.skipped_no_summary,
                 " (SYNTHETIC clusters)" if inputs.train.manifest.get("synthetic") else "",
                 cfg.mds.ranking, cfg.mds.budget_tokens)


def check_has_training_data(cfg: Config, inputs: RunInputs) -> None:
    if len(inputs.train) == 0:
        raise HeadError(f"hibert finetune: {cfg.data.dataset_dir} has no training documents with summaries; "
                        "abstractive finetuning needs a corpus with summaries")


def build_task(cfg: Config, inputs: RunInputs, model_cfg: ModelConfig) -> AbstractiveTask:
    clusters = inputs.train.is_clusters
    if clusters:
        use_ranked_clusters(cfg, inputs)
    else:
        inputs.train, inputs.valid = FirstChunks(inputs.train), FirstChunks(inputs.valid)
        if inputs.rt.is_main:
            log.info("abstractive: %d train / %d valid documents (first chunks; %d later chunks of long documents "
                     "left out)", len(inputs.train), len(inputs.valid), inputs.train.skipped_later_chunks)
    check_has_training_data(cfg, inputs)
    task = AbstractiveTask(cfg, model_cfg)
    task.reads_clusters = clusters
    return task
