"""Evaluating extractive selections: sentence scores of each chunk joined per document, top-k selection (the
model's own k and trigram blocking, tuned on validation when it was exported: `tune_selection`), scored next
to Lead-3 and the oracle."""
from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from hibert.config import Config
from hibert.data_prep import DocumentDataset
from hibert.errors import UserError
from hibert.finetune.base.selection import select
from hibert.finetune.evaluation.report import (
    Document,
    documents,
)
from hibert.finetune.evaluation.rouge import Rouge
from hibert.finetune.evaluation.skeleton import SummaryEvaluation
from hibert.finetune.extractive.export import score_split
from hibert.finetune.extractive.settings import ExtractiveSelection, selection_note, selection_provenance
from hibert.finetune.settings import EvalSettings
from hibert.heads import EvalOutcome, HeadError
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
                       rouge: Rouge | None = None, docs: list[Document] | None = None) -> dict[str, float]:
    """Mean ROUGE F1 of the top-k selection over the documents `chunk_scores` covers whole (`docs`: the split's
    documents, when the caller has them already). A validation capped at `schedule.eval_batches` scores some
    chunks of a long document and not others (its batches are drawn across the split): such a document is left
    out, not scored on the sentences of its first chunks alone."""
    docs = list(documents(dataset)) if docs is None else docs
    scores = chunk_to_doc_scores(dataset, chunk_scores)
    docs = [d for d in docs if d.doc_id in scores and len(scores[d.doc_id]) == len(d.sentences)]
    if not docs:
        raise UserError("no document has every chunk scored: raise schedule.eval_batches (or leave it unset)")
    per_doc = (rouge or Rouge()).score_corpus(system_summaries(docs, scores, k, trigram_blocking),
                                              [d.references for d in docs])
    return {m: float(v.mean()) for m, v in per_doc.items()}


def position_picks(counts: list[int], num_sentences: int, k: int) -> list[int]:
    """The `k` positions (of the document's `num_sentences`) most often in the training oracle, in document order;
    ties and positions the training data never picked go to the earlier one."""
    order = sorted(range(num_sentences), key=lambda j: (-(counts[j] if j < len(counts) else 0), j))
    return sorted(order[:k])


def tune_selection(dataset, chunk_scores: dict[int, np.ndarray], ks=(1, 2, 3, 4, 5),
                   docs: list[Document] | None = None) -> dict[str, Any]:
    """Pick k and trigram blocking on validation by mean ROUGE-1/2/L F1 (`docs`: the documents to tune on, made
    once for the whole grid)."""
    rouge = Rouge(("rouge1", "rouge2", "rougeL"))
    docs = list(documents(dataset)) if docs is None else docs
    grid = []
    for k in ks:
        for tb in (False, True):
            r = rouge_of_selection(dataset, chunk_scores, k, tb, rouge, docs)
            grid.append({"k": k, "trigram_blocking": tb,
                         "rouge": (r["rouge1_f"] + r["rouge2_f"] + r["rougeL_f"]) / 3})
    best = max(grid, key=lambda g: g["rouge"])
    return {"k": best["k"], "trigram_blocking": best["trigram_blocking"], "grid": grid}


class ExtractiveEvaluation(SummaryEvaluation):
    """An extractive export on a split: the top-k sentences in document order, with the selection the model is
    served with (its extractive.json, tuned on validation at export; `--k` evaluates another), next to Lead-3
    and the oracle."""

    def view(self) -> list[Document]:
        cfg, settings, selection = self.cfg, self.settings, self.resolved
        self.test = DocumentDataset(cfg.data.dataset_dir, settings.split)
        if len(self.test) == 0:
            raise UserError(f"hibert evaluate: split {settings.split!r} of {cfg.data.dataset_dir} is empty")
        self.k, self.trigram_blocking = selection.top_k, selection.trigram_blocking
        self.provenance = selection_provenance(self.export_dir)
        self.note = selection_note(selection, self.provenance, given=bool(settings.flags))
        return documents(self.test)

    def baselines(self, docs: list[Document]) -> dict[str, list[list[str]]]:
        """Lead-3 and the oracle; Lead-k at the model's k (when it is not 3); and `position`: the k positions the
        training data's oracle picks most often (selection_tuning.json), a document's existing ones in order —
        what a model that learned only position would extract."""
        out = super().baselines(docs)
        if self.k != 3:
            out[f"lead{self.k}"] = [d.sentences[:self.k] for d in docs]
        prior = (self.provenance or {}).get("train_oracle_positions")
        if prior and prior.get("counts"):
            out["position"] = [[d.sentences[j] for j in position_picks(prior["counts"], len(d.sentences), self.k)]
                               for d in docs]
        return out

    def predict(self, docs: list[Document]) -> list[list[str]]:
        scores = chunk_to_doc_scores(self.test, score_split(self.model, self.test, self.device))
        picks = [[int(j) for j in select(scores[d.doc_id], d.sentences, self.k, self.trigram_blocking)] for d in docs]
        self.model_picks = picks   # the viewer marks these sentences (a source may repeat one)
        return [[d.sentences[j] for j in p] for d, p in zip(docs, picks)]

    def report_meta(self, compared_with: list[str]) -> dict[str, Any]:
        return {"task": "extractive", "model": redact_uri(self.ref), "encoder_init": self.meta.get("init"),
                "dataset": str(self.cfg.data.dataset_dir), "split": self.settings.split, "k": self.k,
                "trigram_blocking": self.trigram_blocking, "selection_given": bool(self.settings.flags),
                "dataset_manifest": self.dataset_manifest(), "finetune_run": self.meta.get("mlflow_run_id"),
                "notes": [self.note]}

    def write_extras(self, out: Path) -> None:
        if self.provenance:   # how the scored selection was chosen (the export's record of its tuning)
            (out / "tuning.json").write_text(json.dumps(self.provenance, indent=1))


def evaluate(cfg: Config, settings: EvalSettings, local: Path, ref: str, clusters: bool,
             selection: ExtractiveSelection) -> EvalOutcome:
    if clusters:
        raise HeadError(f"hibert evaluate: {ref} is an extractive model; {cfg.data.dataset_dir} holds clusters "
                        "(evaluate a ranker, mds or abstractive model on it)")
    return ExtractiveEvaluation(cfg, settings, local, ref, selection).run()
