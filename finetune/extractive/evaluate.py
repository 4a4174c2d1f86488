"""Evaluating extractive selections: sentence scores of each chunk joined per document, top-k selection (k
and trigram blocking tuned on validation), scored next to Lead-3 and the oracle."""
from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data_prep import DocumentDataset
from finetune.base.errors import UserError
from finetune.base.report import (
    Document,
    baseline_systems,
    compared_reports,
    documents,
    pair_with_reports,
    score_systems,
    write_report,
)
from finetune.base.rouge import Rouge
from finetune.base.selection import select
from finetune.base.settings import EvalSettings
from finetune.extractive.export import load_extractive, score_split
from hibert.config import Config
from hibert.hashing import file_hash
from hibert.redact import redact_uri

log = logging.getLogger("hibert.evaluate")


def chunk_to_doc_scores(dataset, chunk_scores: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    parts: dict[str, list[tuple[int, np.ndarray]]] = defaultdict(list)
    for i, sc in chunk_scores.items():
        parts[dataset.source_doc(i)].append((i, sc))
    return {d: np.concatenate([s for _, s in sorted(p, key=lambda t: t[0])]) for d, p in parts.items()}


def system_summaries(docs: list[Document], scores: dict[str, np.ndarray], k: int,
                     trigram_blocking: bool) -> list[list[str]]:
    return [[d.sentences[j] for j in select(scores[d.doc_id], d.sentences, k, trigram_blocking)] for d in docs]


def rouge_of_selection(dataset, chunk_scores: dict[int, np.ndarray], k: int, trigram_blocking: bool,
                       rouge: Rouge | None = None) -> dict[str, float]:
    docs = [d for d in documents(dataset)]
    scores = chunk_to_doc_scores(dataset, chunk_scores)
    docs = [d for d in docs if d.doc_id in scores]
    per_doc = (rouge or Rouge()).score_corpus(system_summaries(docs, scores, k, trigram_blocking),
                                              [d.references for d in docs])
    return {m: float(v.mean()) for m, v in per_doc.items()}


def tune_selection(dataset, chunk_scores: dict[int, np.ndarray], ks=(1, 2, 3, 4, 5)) -> dict[str, Any]:
    """Pick k and trigram blocking on validation by mean ROUGE-1/2/L F1."""
    rouge = Rouge(("rouge1", "rouge2", "rougeL"))
    grid = []
    for k in ks:
        for tb in (False, True):
            r = rouge_of_selection(dataset, chunk_scores, k, tb, rouge)
            grid.append({"k": k, "trigram_blocking": tb,
                         "rouge": (r["rouge1_f"] + r["rouge2_f"] + r["rougeL_f"]) / 3})
    best = max(grid, key=lambda g: g["rouge"])
    return {"k": best["k"], "trigram_blocking": best["trigram_blocking"], "grid": grid}


def evaluate_systems(docs: list[Document], scores: dict[str, np.ndarray] | None, k: int, trigram_blocking: bool,
                     n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """ROUGE (mean and 95% CI) of the extractive model, Lead-3 and the oracle on the same documents."""
    systems: dict[str, list[list[str]]] = {}
    if scores is not None:
        systems["model"] = system_summaries(docs, scores, k, trigram_blocking)
    systems.update(baseline_systems(docs))
    return score_systems(docs, systems, n_resamples, seed)


def evaluate_export(cfg: Config, settings: EvalSettings, local: Path, ref: str) -> dict[str, Any]:
    """Score a split with an extractive export (k and trigram blocking tuned on 'valid' unless
    `settings.no_tune`) next to Lead-3 and the oracle, and write the report."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, meta = load_extractive(local, device)
    test = DocumentDataset(cfg.data.dataset_dir, settings.split)
    if len(test) == 0:
        raise UserError(f"hibert evaluate: split {settings.split!r} of {cfg.data.dataset_dir} is empty")
    k, tb = meta["selection"].get("top_k", cfg.objective.top_k), meta["selection"].get("trigram_blocking", False)
    tuning = None
    if not settings.no_tune:
        valid = DocumentDataset(cfg.data.dataset_dir, "valid")
        if len(valid):
            tuning = tune_selection(valid, score_split(model, valid, device))
            k, tb = tuning["k"], tuning["trigram_blocking"]
            log.info("tuned on valid: k=%d trigram_blocking=%s", k, tb)
    docs = documents(test)
    scores = chunk_to_doc_scores(test, score_split(model, test, device))
    result = evaluate_systems(docs, scores, k, tb, n_resamples=settings.bootstrap)
    manifest = Path(cfg.data.dataset_dir) / "manifest.json"
    report_meta = {"model": redact_uri(ref), "encoder_init": meta.get("init"), "dataset": str(cfg.data.dataset_dir),
                   "split": settings.split, "k": k,
                   "trigram_blocking": tb, "dataset_manifest": file_hash(manifest) if manifest.is_file() else "none",
                   "finetune_run": meta.get("mlflow_run_id")}
    out = settings.report_dir(cfg.run_dir)
    paths = write_report(out, result, docs, report_meta)
    if tuning:
        (out / "tuning.json").write_text(json.dumps(tuning, indent=1))
    if settings.compare:
        pair_with_reports(result, compared_reports(settings.compare, settings.split), settings.bootstrap)
        paths = write_report(out, result, docs, report_meta)
    return {"result": result, "paths": paths, "meta": report_meta, "out": out}
