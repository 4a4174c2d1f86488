"""The evaluation skeleton every head fills in: load → view → predict → baselines → score → pair → write. A head
says how to load its export, which documents of the split it scores (and keeps what its prediction needs), how
it predicts, which baselines stand next to it, which extra metrics and report meta it adds; the order is the
skeleton's, the same for every head. The scoring, the pairing with other runs' reports and the report files
are its report kind's (`ReportKind`): ROUGE of summaries with bootstrap CIs, paired differences and
`--compare` (`RougeReport`, every summarizing head), or a kind of the head's own where ROUGE of a summary does
not fit (the ranker's recall of its top units, finetune/ranker/evaluate.py)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch

from hibert.config import Config
from hibert.errors import UserError
from hibert.finetune.evaluation.report import (
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
from hibert.finetune.inference.fluency import fluency_note
from hibert.finetune.settings import EvalSettings
from hibert.hashing import file_hash
from hibert.heads import EvalOutcome, head_of_export


class ReportKind:
    """How one kind of report scores its systems, pairs them with other runs' reports and is written.
    `model_row`: the report's name for the evaluated model's system."""
    model_row = "model"

    def compared(self, settings: EvalSettings) -> dict[str, dict[str, Any]]:
        """Other runs' reports to pair with (`--compare`), loaded before any work."""
        return {}

    def check_names(self, reports: dict[str, dict[str, Any]], systems: list[str]) -> None:
        """Refuse a compared report named like one of this report's systems."""

    def score(self, docs: list, systems: dict[str, list], n_resamples: int) -> dict[str, Any]:
        raise NotImplementedError

    def pair(self, result: dict[str, Any], reports: dict[str, dict[str, Any]], n_resamples: int) -> None:
        """Paired differences with the compared reports, added to `result`."""

    def write(self, out: Path, result: dict[str, Any], docs: list, meta: dict[str, Any]) -> dict[str, Path]:
        raise NotImplementedError

    def lines(self, result: dict[str, Any], paths: dict[str, Path]) -> list[str]:
        """What `hibert evaluate` prints."""
        raise NotImplementedError

    def tracked(self, result: dict[str, Any]) -> dict[str, Any]:
        """What `hibert evaluate` logs to MLflow: {"systems": {name: {metric: {"mean": x}}}, "doc_ids": [...],
        "per_document": {name: {metric: [...]}}}."""
        return result


class RougeReport(ReportKind):
    """ROUGE of each system's summaries against the references: bootstrap CIs, paired differences, `--compare`
    with other runs' reports (paired by document), Markdown / JSON / chart / viewer."""

    def compared(self, settings: EvalSettings) -> dict[str, dict[str, Any]]:
        return compared_reports(settings.compare, settings.split)

    def check_names(self, reports: dict[str, dict[str, Any]], systems: list[str]) -> None:
        check_compare_names(reports, systems)

    def score(self, docs: list[Document], systems: dict[str, list[list[str]]], n_resamples: int) -> dict[str, Any]:
        return score_systems(docs, systems, n_resamples=n_resamples)

    def pair(self, result: dict[str, Any], reports: dict[str, dict[str, Any]], n_resamples: int) -> None:
        pair_with_reports(result, reports, n_resamples)

    def write(self, out: Path, result: dict[str, Any], docs: list[Document], meta: dict[str, Any]) -> dict[str, Path]:
        return write_report(out, result, docs, meta)

    def lines(self, result: dict[str, Any], paths: dict[str, Path]) -> list[str]:
        return score_lines(result, paths)


class Evaluation(ABC):
    kind: ReportKind = RougeReport()
    # `predict` of an extractive head may set the source indices it selected per document: the viewer then marks
    # those sentences, not the first copy of a sentence the source repeats
    model_picks: list[list[int]] | None = None

    def __init__(self, cfg: Config, settings: EvalSettings, export_dir: Path, ref: str, resolved: Any = None):
        """`resolved`: the head's inference settings (its decoding, its selection), resolved once by the command
        from the export's own and the flags given (finetune/inference/flags.py)."""
        self.cfg, self.settings, self.export_dir, self.ref = cfg, settings, Path(export_dir), ref
        self.resolved = resolved
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
    def view(self) -> list:
        """The split's documents (or clusters) to score, in order (keep on `self` what `predict` needs)."""

    @abstractmethod
    def predict(self, docs: list) -> list:
        """The model's output for each document: what the report kind scores (a summary's sentences, a ranking)."""

    @abstractmethod
    def baselines(self, docs: list) -> dict[str, list]:
        """The systems reported next to the model, each an output per document."""

    def add_metrics(self, result: dict[str, Any], docs: list[Document], systems: dict[str, list[list[str]]]) -> None:
        """Metrics beyond ROUGE, added to `result` in place (e.g. novel n-grams)."""

    @abstractmethod
    def report_meta(self, compared_with: list[str]) -> dict[str, Any]:
        """The report's meta: what was evaluated, on what, how (`dataset_manifest()` ties it to the data). It may
        hold `notes` (a string or a list of them: what a reader must know before the numbers, shown first in
        report.md and the viewer) and `reads_sentences` (the model reads the first N sentences of each document:
        the viewer greys the rest)."""

    def write_extras(self, out: Path) -> None:
        """Files of the head's own next to the report (e.g. the tuning of k)."""

    # ------------------------------------------------------------------ the skeleton
    def notes(self, own: Any) -> list[str]:
        """The report's notes, first in its meta: the decoder's fluency note (a head whose exports record whether
        their decoder writes yet, `HeadSpec.decodes`), then the head's own (`notes` of its report meta)."""
        notes = []
        if head_of_export(self.export_dir).decodes:
            note = fluency_note(self.export_dir)
            if note:
                notes.append(note)
        own = [own] if isinstance(own, str) else list(own or [])
        return notes + [str(n) for n in own if n]

    def dataset_manifest(self) -> str:
        manifest = Path(self.cfg.data.dataset_dir) / "manifest.json"
        return file_hash(manifest) if manifest.is_file() else "none"

    def run(self) -> EvalOutcome:
        s, kind = self.settings, self.kind
        reports = kind.compared(s)   # a bad --compare fails before any work
        self.model, self.meta = self.load()
        with recording_left_out() as left_out:
            docs = self.view()
        baselines = self.baselines(docs)
        kind.check_names(reports, [kind.model_row, *baselines])   # before predicting: a clash would replace a pair
        systems = {kind.model_row: self.predict(docs), **baselines}
        result = kind.score(docs, systems, s.bootstrap)
        if self.model_picks is not None:
            result["picks"] = {kind.model_row: self.model_picks}
        if isinstance(kind, RougeReport):   # what the model wrote per document: what a served answer must equal
            result["outputs"] = {kind.model_row: systems[kind.model_row]}
        kind.pair(result, reports, s.bootstrap)
        self.add_metrics(result, docs, systems)
        meta = self.report_meta(sorted(reports))
        meta = {"notes": self.notes(meta.pop("notes", None)), **meta}   # first: read before the numbers
        if left_out.get(s.split):
            meta["documents_without_summary"] = len(left_out[s.split])   # left out of scoring (logged)
        out = s.report_dir(self.cfg.run_dir)
        paths = kind.write(out, result, docs, meta)
        self.write_extras(out)
        return EvalOutcome(out, kind.lines(result, paths), kind.tracked(result), meta)


class SummaryEvaluation(Evaluation):
    """A summarizing head's evaluation: ROUGE of its summaries next to Lead-3 and the oracle (by default)."""
    kind = RougeReport()

    def baselines(self, docs: list[Document]) -> dict[str, list[list[str]]]:
        return baseline_systems(docs)
