"""The multi-document summarizer's registration (Liu & Lapata 2019 on HIBERT): ranked units of a cluster ->
local and global layers -> decoder."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hibert.config import Config
from hibert.config.mds import ranking_kind
from hibert.config.model import ModelConfig
from hibert.finetune.abstractive.evaluate import ClusterEvaluation
from hibert.finetune.abstractive.head import check_has_training_data, use_ranked_clusters
from hibert.finetune.abstractive.task import pretraining_decoder
from hibert.finetune.base.settings import EvalSettings, SummarizeSettings
from hibert.finetune.heads import EvalOutcome, HeadError, HeadSpec, register_head
from hibert.finetune.mds.export import load_mds, stored_mds_settings
from hibert.finetune.mds.summarize import ClusterSummarizer
from hibert.finetune.mds.task import MDSTask
from hibert.finetune.ranker.head import need_clusters
from hibert.registry import resolve_model, tracking_uri

if TYPE_CHECKING:  # the runtime brings DeepSpeed (~2.5 s); summarize and evaluate never need it
    from hibert.runtime.run import RunInputs


def build_task(cfg: Config, inputs: RunInputs, model_cfg: ModelConfig) -> MDSTask:
    need_clusters(cfg, inputs)
    decoder_state = pretraining_decoder(cfg, inputs.init) if cfg.finetune.init_decoder else None
    use_ranked_clusters(cfg, inputs)
    check_has_training_data(cfg, inputs)
    task = MDSTask(cfg, model_cfg, inputs.init.state if inputs.init else None, decoder_state)
    task.reads_clusters = True
    return task


def evaluate(cfg: Config, settings: EvalSettings, local: Path, ref: str, clusters: bool) -> EvalOutcome:
    if not clusters:
        raise HeadError(f"hibert evaluate: {ref} is a multi-document model; {cfg.data.dataset_dir} holds "
                        "documents, not clusters")
    return ClusterEvaluation(cfg, settings, local, ref, mds=True).run()


def summarizer(cfg: Config, local: Path, device: str, generation, settings: SummarizeSettings) -> ClusterSummarizer:
    """Units ranked as `--ranking` says, else as the model was trained (a learned ranker is resolved here)."""
    ranking = settings.ranking or stored_mds_settings(local).ranking
    ranker_dir = None
    if ranking_kind(ranking) == "learned":
        ranker_dir = resolve_model(ranking, tracking_uri(cfg.tracking.uri, cfg.run.output_dir),
                                   cfg.run_dir / "summarize-ranker")
    return ClusterSummarizer(local, device, cfg.data.segmenter.stanza_dir, lambda base: generation, ranking,
                             ranker_dir)


SPEC = register_head(HeadSpec(
    name="mds", title="multi-document summarizer", registered_model="hibert-mds",
    build_task=build_task, evaluate=evaluate, summarizer=summarizer, reads="clusters", decodes=True,
    load=load_mds, config_sections=("decoder", "generation", "mds"),
    export_files=("decoder.safetensors", "abstractive.json", "generation.json", "mds.json")))

