"""`hibert evaluate` for the ranker, through the shared evaluation skeleton (finetune/evaluation/skeleton.py)
with a report kind of its own: ROUGE-L recall of the top L' units of the ranker's order next to tf-idf,
document order and the label oracle (Liu & Lapata's Table 1), with paired bootstrap. Reports on synthetic
clusters say so."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hibert.config import Config
from hibert.data_prep import DocumentDataset
from hibert.errors import UserError
from hibert.finetune.base.clusters import all_units_view, data_note, rank_order, tfidf_scores
from hibert.finetune.evaluation.report import meta_lines, notes_lines
from hibert.finetune.evaluation.rouge import bootstrap_ci, format_p, paired_bootstrap
from hibert.finetune.evaluation.skeleton import Evaluation, ReportKind
from hibert.finetune.ranker.export import score_clusters
from hibert.finetune.ranker.metrics import CUTOFFS, ranking_table
from hibert.finetune.settings import EvalSettings
from hibert.heads import EvalOutcome, HeadError
from hibert.redact import redact_uri

log = logging.getLogger("hibert.evaluate")


@dataclass
class Cluster:
    """One cluster of the split as the ranker reads it: its units (texts and ids), title, reference."""
    doc_id: str
    units_text: list
    units: list
    title: Any
    title_ids: Any
    summary: list[str]
    unit_scores: np.ndarray


class RankingReport(ReportKind):
    """ROUGE-L recall (rouge-score, stemmed, x100) of the top L' units of each ordering, concatenated, against
    the reference, with 95% bootstrap CIs; the ranker paired with tf-idf and with document order."""
    model_row = "ranker"

    def score(self, docs: list[Cluster], systems: dict[str, list[np.ndarray]], n_resamples: int) -> dict[str, Any]:
        table = ranking_table([c.units_text for c in docs], [c.summary for c in docs], systems)
        rows = {name: {str(c): {"mean": float(v.mean()), **dict(zip(("low", "high"), bootstrap_ci(v, n_resamples)))}
                       for c, v in by_cut.items()} for name, by_cut in table.items()}
        paired = {f"ranker-{other}": {str(c): paired_bootstrap(table["ranker"][c], table[other][c], n_resamples)
                                      for c in CUTOFFS} for other in ("tfidf", "document_order")}
        return {"recall": rows, "paired": paired,
                "per_cluster": {"doc_ids": [c.doc_id for c in docs],
                                **{name: {str(c): v.round(4).tolist() for c, v in by_cut.items()}
                                   for name, by_cut in table.items()}}}

    def write(self, out: Path, result: dict[str, Any], docs: list[Cluster], meta: dict[str, Any]) -> dict[str, Path]:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps({"meta": meta, **result}, indent=1))
        title = "# Unit ranking report" + (" (SYNTHETIC clusters)" if meta.get("clusters") == "synthetic" else "")
        lines = [title, "", *notes_lines(meta), *meta_lines(meta), "",
                 "| ranking | " + " | ".join(f"L'={c}" for c in CUTOFFS) + " |", "|---|" + "---|" * len(CUTOFFS)]
        for name, by_cut in result["recall"].items():
            lines.append(f"| {name} | " + " | ".join(f"{by_cut[str(c)]['mean']:.2f} [{by_cut[str(c)]['low']:.2f}, "
                                                     f"{by_cut[str(c)]['high']:.2f}]" for c in CUTOFFS) + " |")
        lines += ["", "Paired bootstrap (difference of ROUGE-L recall, 95% CI, two-sided p):", "",
                  "| pair | " + " | ".join(f"L'={c}" for c in CUTOFFS) + " |", "|---|" + "---|" * len(CUTOFFS)]
        for pair, by_cut in result["paired"].items():
            cells = [f"{d['diff']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] " + format_p(d["p_value"], d["resamples"])
                     for d in by_cut.values()]
            lines.append(f"| {pair} | " + " | ".join(cells) + " |")
        (out / "report.md").write_text("\n".join(lines) + "\n")
        return {"json": out / "report.json", "md": out / "report.md"}

    def lines(self, result: dict[str, Any], paths: dict[str, Path]) -> list[str]:
        lines = [f"{name:15s} " + "  ".join(f"L'={c}: {v['mean']:.2f}" for c, v in by_cut.items())
                 for name, by_cut in result["recall"].items()]
        for pair, by_cut in result["paired"].items():
            d = by_cut["5"]
            lines.append(f"{pair:22s} L'=5 {d['diff']:+.2f} [{d['low']:+.2f},{d['high']:+.2f}] "
                         f"{format_p(d['p_value'], d['resamples'])} (paired)")
        lines.append(f"report: {paths['md']}")
        return lines

    def tracked(self, result: dict[str, Any]) -> dict[str, Any]:
        """Mean recall per ranking and cutoff (metrics `<ranking>_recall_at_<L'>`) and the per-cluster values
        (the run's per-document table), in the summary reports' shape."""
        per_cluster = {k: v for k, v in result["per_cluster"].items() if k != "doc_ids"}
        return {"systems": {name: {f"recall_at_{c}": {"mean": v["mean"]} for c, v in by_cut.items()}
                            for name, by_cut in result["recall"].items()},
                "doc_ids": result["per_cluster"]["doc_ids"],
                "per_document": {name: {f"recall_at_{c}": values for c, values in by_cut.items()}
                                 for name, by_cut in per_cluster.items()}}


class RankerEvaluation(Evaluation):
    """A ranker export on a split of clusters: its order of every cluster's units next to tf-idf (to the title,
    else the centroid), document order and the ROUGE-2 label oracle."""
    kind = RankingReport()

    def view(self) -> list[Cluster]:
        cfg, s = self.cfg, self.settings
        self.test = DocumentDataset(cfg.data.dataset_dir, s.split)
        view = all_units_view(self.test)
        n = len(view) if not s.limit else min(s.limit, len(view))
        if n == 0:
            raise UserError(f"hibert evaluate: split {s.split!r} of {cfg.data.dataset_dir} has no clusters with "
                            "summaries")
        return [Cluster(view.doc_id(k), view.units_text(k), view.units(k), view.title(k), view.title_ids(k),
                        view.summary_text(k), view.unit_scores(k)) for k in range(n)]

    def predict(self, docs: list[Cluster]) -> list[np.ndarray]:
        scores = score_clusters(self.model, [c.units for c in docs], self.device, [c.title_ids for c in docs])
        return [rank_order(s) for s in scores]

    def baselines(self, docs: list[Cluster]) -> dict[str, list[np.ndarray]]:
        return {"tfidf": [rank_order(tfidf_scores([" ".join(u) for u in c.units_text], c.title)) for c in docs],
                "document_order": [np.arange(len(c.units_text)) for c in docs],
                "oracle": [rank_order(c.unit_scores) for c in docs]}

    def report_meta(self, compared_with: list[str]) -> dict[str, Any]:
        # "clusters" is data_note's real / synthetic; the count is num_clusters
        return {"task": "ranker", **data_note(self.test), "model": redact_uri(self.ref),
                "encoder_init": self.meta.get("init"), "dataset": str(self.cfg.data.dataset_dir),
                "split": self.settings.split, "num_clusters": self.num_clusters,
                "dataset_manifest": self.dataset_manifest(),
                "measure": "ROUGE-L recall (rouge-score, stemmed, x100) of the top L' units concatenated "
                           "against the reference (Liu & Lapata 2019, Table 1)",
                "units_per_cluster": self.units_per_cluster}

    def add_metrics(self, result: dict[str, Any], docs: list[Cluster], systems: dict[str, list]) -> None:
        self.num_clusters, self.units_per_cluster = len(docs), float(np.mean([len(c.units_text) for c in docs]))


def evaluate(cfg: Config, settings: EvalSettings, local: Path, ref: str, clusters: bool, resolved: None) -> EvalOutcome:
    if not clusters:
        raise HeadError(f"hibert evaluate: {ref} is a multi-document model; {cfg.data.dataset_dir} holds "
                        "documents, not clusters")
    return RankerEvaluation(cfg, settings, local, ref).run()


def report_lines(name: str, report: dict) -> list[str]:
    """A ranker's report as `hibert demo` prints it: ROUGE-L recall of the top L' units, not summaries."""
    lines = [f"== {name}: ROUGE-L recall of the top L' units ({report['meta'].get('clusters')} clusters) =="]
    for ranking, by_cut in report["recall"].items():
        lines.append(f"  {ranking:<15}" + "  ".join(f"L'={c} {v['mean']:5.2f}" for c, v in by_cut.items()))
    d = report["paired"]["ranker-tfidf"]["5"]
    lines.append(f"  ranker - tfidf at L'=5: {d['diff']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] p={d['p_value']:.3g}")
    return lines
