"""The unit ranker's registration (Liu & Lapata 2019 §3): scores every unit of a cluster; it ranks, it does
not summarize."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.finetune.base.clusters import all_units_view
from hibert.finetune.base.rouge import format_p
from hibert.finetune.base.settings import EvalSettings
from hibert.finetune.heads import EvalOutcome, HeadError, HeadSpec, register_head
from hibert.finetune.ranker.evaluate import evaluate_ranker
from hibert.finetune.ranker.export import load_ranker
from hibert.finetune.ranker.task import RankerTask

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
    return RankerTask(cfg, model_cfg, inputs.init.state if inputs.init else None)


def evaluate(cfg: Config, settings: EvalSettings, local: Path, ref: str, clusters: bool) -> EvalOutcome:
    if not clusters:
        raise HeadError(f"hibert evaluate: {ref} is a multi-document model; {cfg.data.dataset_dir} holds "
                        "documents, not clusters")
    done = evaluate_ranker(cfg, settings, local, ref)
    lines = [f"{name:15s} " + "  ".join(f"L'={c}: {v['mean']:.2f}" for c, v in by_cut.items())
             for name, by_cut in done["payload"]["recall"].items()]
    for pair, by_cut in done["payload"]["paired"].items():
        d = by_cut["5"]
        lines.append(f"{pair:22s} L'=5 {d['diff']:+.2f} [{d['low']:+.2f},{d['high']:+.2f}] "
                     f"{format_p(d['p_value'], d['resamples'])} (paired)")
    lines.append(f"report: {done['out'] / 'report.md'}")
    return EvalOutcome(done["out"], lines, mlflow_result(done["payload"]), done["meta"])


def mlflow_result(payload: dict) -> dict:
    """What `hibert evaluate` logs to MLflow, in the summary heads' shape: mean recall per ranking and cutoff
    (metrics `<ranking>_recall_at_<L'>`) and the per-cluster values (the run's per-document table)."""
    per_cluster = {k: v for k, v in payload["per_cluster"].items() if k != "doc_ids"}
    return {"systems": {name: {f"recall_at_{c}": {"mean": v["mean"]} for c, v in by_cut.items()}
                        for name, by_cut in payload["recall"].items()},
            "doc_ids": payload["per_cluster"]["doc_ids"],
            "per_document": {name: {f"recall_at_{c}": values for c, values in by_cut.items()}
                             for name, by_cut in per_cluster.items()}}


SPEC = register_head(HeadSpec(
    name="ranker", title="unit ranker", registered_model="hibert-ranker",
    build_task=build_task, evaluate=evaluate, summarizer=None, reads="clusters",
    load=load_ranker, config_sections=("mds",),
    export_files=("ranker.safetensors", "ranker.json")))

