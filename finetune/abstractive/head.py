"""The abstractive head's registration: HIBERT encoder + Transformer decoder on documents (the first chunk of
each), or — on a cluster dataset — the flat multi-document baseline reading the ranked units back to back."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.finetune.abstractive.data import FirstChunks
from hibert.finetune.abstractive.evaluate import AbstractiveEvaluation, ClusterEvaluation
from hibert.finetune.abstractive.export import load_abstractive
from hibert.finetune.abstractive.summarize import AbstractiveSummarizer
from hibert.finetune.abstractive.task import AbstractiveTask, pretraining_decoder
from hibert.finetune.base.settings import EvalSettings, SummarizeSettings
from hibert.finetune.heads import EvalOutcome, HeadError, HeadSpec, register_head
from hibert.finetune.ranker.ranking import ranked_view

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
    decoder_state = pretraining_decoder(cfg, inputs.init) if cfg.finetune.init_decoder else None
    clusters = inputs.train.is_clusters
    if clusters:
        use_ranked_clusters(cfg, inputs)
    else:
        inputs.train, inputs.valid = FirstChunks(inputs.train), FirstChunks(inputs.valid)
        if inputs.rt.is_main:
            log.info("abstractive: %d train / %d valid documents (first chunks; %d later chunks of long documents "
                     "left out)", len(inputs.train), len(inputs.valid), inputs.train.skipped_later_chunks)
    check_has_training_data(cfg, inputs)
    task = AbstractiveTask(cfg, model_cfg, inputs.init.state if inputs.init else None, decoder_state)
    task.reads_clusters = clusters
    return task


def evaluate(cfg: Config, settings: EvalSettings, local: Path, ref: str, clusters: bool) -> EvalOutcome:
    if clusters:
        return ClusterEvaluation(cfg, settings, local, ref, mds=False).run()
    return AbstractiveEvaluation(cfg, settings, local, ref).run()


def summarizer(cfg: Config, local: Path, device: str, generation, settings: SummarizeSettings):
    return AbstractiveSummarizer(local, device, cfg.data.segmenter.stanza_dir, lambda base: generation)


SPEC = register_head(HeadSpec(
    name="abstractive", title="abstractive finetuning", registered_model="hibert-abstractive",
    build_task=build_task, evaluate=evaluate, summarizer=summarizer, decodes=True,
    load=load_abstractive, config_sections=("decoder", "generation", "mds"),
    export_files=("decoder.safetensors", "abstractive.json", "generation.json")))

