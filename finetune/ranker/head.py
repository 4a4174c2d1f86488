"""The unit ranker's parts (registered in spec.py; Liu & Lapata 2019 §3): scores every unit of a cluster; it
ranks, it does not summarize."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.finetune.base.clusters import all_units_view
from hibert.finetune.ranker.task import RankerTask
from hibert.heads import HeadError

if TYPE_CHECKING:  # the runtime brings DeepSpeed (~2.5 s); summarize and evaluate never need it
    from hibert.runtime.run import RunInputs


def need_clusters(cfg: Config, inputs: RunInputs) -> None:
    if not inputs.train.is_clusters:
        raise HeadError(f"hibert finetune: finetune.task={cfg.finetune.task} needs a cluster dataset "
                        f"({cfg.data.dataset_dir} holds documents); prepare one from multi-document sources")


def build_task(cfg: Config, inputs: RunInputs, model_cfg: ModelConfig) -> RankerTask:
    need_clusters(cfg, inputs)
    inputs.train, inputs.valid = all_units_view(inputs.train), all_units_view(inputs.valid)
    if len(inputs.train) == 0:
        raise HeadError(f"hibert finetune: {cfg.data.dataset_dir} has no training clusters with summaries")
    if inputs.rt.is_main:
        logging.getLogger("hibert").info(
            "ranker: %d train / %d valid clusters%s", len(inputs.train), len(inputs.valid),
            " (SYNTHETIC clusters)" if inputs.train.manifest.get("synthetic") else "")
    return RankerTask(cfg, model_cfg)
