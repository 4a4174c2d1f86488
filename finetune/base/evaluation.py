"""The evaluation skeleton every summarizing head fills in: load → view → predict → baselines → score →
pair → write. A head says how to load its export, which documents of the split it scores (and keeps what
its prediction needs), how it predicts, which baselines stand next to it, which extra metrics and report
meta it adds; the order, the scoring (ROUGE with bootstrap CIs, paired differences), the `--compare`
pairing with other runs' reports and the report files are the skeleton's, the same for every head."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch

from hibert.config import Config
from hibert.errors import UserError
from hibert.finetune.base.report import (
    Document,
    baseline_systems,
    check_compare_names,
    compared_reports,
    pair_with_reports,
    recording_left_out,
    score_lines,
    score_systems,
    write_report,
)
from hibert.finetune.base.settings import EvalSettings
from hibert.finetune.heads import EvalOutcome, head_of_export
from hibert.hashing import file_hash


class SummaryEvaluation(ABC):
    # `predict` of an extractive head may set the source indices it selected per document: the viewer then marks
    # those sentences, not the first copy of a sentence the source repeats
    model_picks: list[list[int]] | None = None

    def __init__(self, cfg: Config, settings: EvalSettings, export_dir: Path, ref: str):
        self.cfg, self.settings, self.export_dir, self.ref = cfg, settings, Path(export_dir), ref
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model: torch.nn.Module | None = None
        self.meta: dict[str, Any] = {}

    # ------------------------------------------------------------------ what a head fills in
    def load(self) -> tuple[torch.nn.Module, dict[str, Any]]:
        """(model, export settings) of `self.export_dir`, by the loader its head registered."""
        head = head_of_export(self.export_dir)
        if head.load is None:
            raise UserError(f"hibert evaluate: a {head.name} model registers no loader")
        return head.load(self.export_dir, self.device)

    @abstractmethod
    def view(self) -> list[Document]:
        """The split's documents to score, in order (keep on `self` what `predict` needs)."""

    @abstractmethod
    def predict(self, docs: list[Document]) -> list[list[str]]:
        """The model's summary (sentences) of each document."""

    def baselines(self, docs: list[Document]) -> dict[str, list[list[str]]]:
        """The systems reported next to the model (default: Lead-3 and the oracle)."""
        return baseline_systems(docs)

    def add_metrics(self, result: dict[str, Any], docs: list[Document], systems: dict[str, list[list[str]]]) -> None:
        """Metrics beyond ROUGE, added to `result` in place (e.g. novel n-grams)."""

    @abstractmethod
    def report_meta(self, compared_with: list[str]) -> dict[str, Any]:
        """The report's meta: what was evaluated, on what, how (`dataset_manifest()` ties it to the data)."""

    def write_extras(self, out: Path) -> None:
        """Files of the head's own next to the report (e.g. the tuning of k)."""

    # ------------------------------------------------------------------ the skeleton
    def dataset_manifest(self) -> str:
        manifest = Path(self.cfg.data.dataset_dir) / "manifest.json"
        return file_hash(manifest) if manifest.is_file() else "none"

    def run(self) -> EvalOutcome:
        s = self.settings
        reports = compared_reports(s.compare, s.split)   # a bad --compare fails before any work
        self.model, self.meta = self.load()
        with recording_left_out() as left_out:
            docs = self.view()
        baselines = self.baselines(docs)
        check_compare_names(reports, ["model", *baselines])   # before decoding: a clash would replace a pair
        systems = {"model": self.predict(docs), **baselines}
        result = score_systems(docs, systems, n_resamples=s.bootstrap)
        if self.model_picks is not None:
            result["picks"] = {"model": self.model_picks}
        pair_with_reports(result, reports, s.bootstrap)
        self.add_metrics(result, docs, systems)
        meta = self.report_meta(sorted(reports))
        if left_out.get(s.split):
            meta["documents_without_summary"] = len(left_out[s.split])   # left out of scoring (logged)
        out = s.report_dir(self.cfg.run_dir)
        paths = write_report(out, result, docs, meta)
        self.write_extras(out)
        return EvalOutcome(out, score_lines(result, paths), result, meta)
