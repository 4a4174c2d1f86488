"""The extractive head's registration: sentence labelling on documents (HIBERT §3.3)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.finetune.base.settings import EvalSettings, SummarizeSettings
from hibert.finetune.extractive.evaluate import ExtractiveEvaluation
from hibert.finetune.extractive.export import load_extractive
from hibert.finetune.extractive.summarize import Summarizer
from hibert.finetune.extractive.task import ExtractiveTask
from hibert.finetune.heads import EvalOutcome, HeadError, HeadSpec, register_head

if TYPE_CHECKING:  # the runtime brings DeepSpeed (~2.5 s); summarize and evaluate never need it
    from hibert.runtime.run import RunInputs


def build_task(cfg: Config, inputs: RunInputs, model_cfg: ModelConfig) -> ExtractiveTask:
    if inputs.train.is_clusters:
        raise HeadError(f"hibert finetune: finetune.task=extractive reads documents; {cfg.data.dataset_dir} "
                        "holds clusters (use finetune.task=ranker, mds or abstractive)")
    return ExtractiveTask(cfg, model_cfg, inputs.init.state if inputs.init else None)


def evaluate(cfg: Config, settings: EvalSettings, local: Path, ref: str, clusters: bool) -> EvalOutcome:
    if clusters:
        raise HeadError(f"hibert evaluate: {ref} is an extractive model; {cfg.data.dataset_dir} holds clusters "
                        "(evaluate a ranker, mds or abstractive model on it)")
    return ExtractiveEvaluation(cfg, settings, local, ref).run()


def summarizer(cfg: Config, local: Path, device: str, generation, settings: SummarizeSettings) -> Summarizer:
    return Summarizer(local, device, cfg.data.segmenter.stanza_dir, k=settings.k)


SPEC = register_head(HeadSpec(
    name="extractive", title="extractive finetuning", registered_model="hibert-extractive",
    build_task=build_task, evaluate=evaluate, summarizer=summarizer,
    load=load_extractive, config_sections=("objective",),
    export_files=("head.safetensors", "extractive.json")))

