"""`hibert compare`: paired bootstrap between evaluation reports already written, without decoding again.

Each argument names a report (`report.json`, its directory, or a run directory holding
`report-<split>/report.json`), optionally `NAME=` in front and `#SYSTEM` behind to pick a row other than the
model (`lead=runs/mds/mds-hibert#lead_ranked`). The first is the reference: every other one is paired with it
over the documents both reports hold (by document id), F1 of ROUGE-1/2/L/Lsum, difference with its 95% CI and
a two-sided p-value, as `hibert evaluate --compare` does.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hibert.errors import UserError
from hibert.finetune.base.report import HEADLINE, compared_reports
from hibert.finetune.base.rouge import bootstrap_ci, format_p, paired_bootstrap


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("reports", nargs="+", metavar="[NAME=]PATH[#SYSTEM]",
                   help="reports to pair; the first is the reference (SYSTEM: a row of that report, default model)")
    p.add_argument("--split", default="test", help="for run directories: read report-<split>/report.json")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the table as JSON")


def load_system(item: str, split: str) -> tuple[str, dict[str, Any], list[str]]:
    """(name, {metric: per-document F1}, document ids) of one `[NAME=]PATH[#SYSTEM]`."""
    spec, _, system = item.partition("#")
    name, _, path = spec.rpartition("=")
    report = next(iter(compared_reports([f"x={path}"], split).values()))
    where = Path(path).resolve()
    where = where.parent if where.suffix == ".json" else where
    label = where.parent.name if where.name.startswith("report-") else where.name  # the run's name
    system = system or "model"
    per_doc = report.get("per_document", {})
    if system not in per_doc:
        raise UserError(f"hibert compare: {item!r}: the report has no per-document scores for {system!r} "
                         f"(it has {', '.join(k for k in per_doc if k != 'doc_ids') or 'none'})")
    return (name or (label if system == "model" else f"{label}#{system}")), per_doc[system], per_doc["doc_ids"]


def compare(items: list[str], split: str, n_resamples: int) -> dict[str, Any]:

    systems = [load_system(item, split) for item in items]
    ref_name, ref_scores, ref_ids = systems[0]
    out: dict[str, Any] = {"reference": ref_name, "systems": {}, "paired": {}}
    for name, scores, ids in systems:
        out["systems"][name] = {m: dict(zip(("mean", "low", "high"), (float(np.mean(scores[m])),
                                                                      *bootstrap_ci(np.asarray(scores[m]), n_resamples))))
                                for m in HEADLINE}
        out["systems"][name]["documents"] = len(ids)
    where = {d: i for i, d in enumerate(ref_ids)}
    for name, scores, ids in systems[1:]:
        common = [(where[d], j) for j, d in enumerate(ids) if d in where]
        if not common:
            raise UserError(f"hibert compare: {name} shares no documents with {ref_name}")
        a_idx, b_idx = (list(x) for x in zip(*common))
        out["paired"][f"{name}-{ref_name}"] = {
            "documents": len(common),
            **{m: paired_bootstrap(np.asarray(scores[m])[b_idx], np.asarray(ref_scores[m])[a_idx], n_resamples)
               for m in HEADLINE}}
    return out


def render(result: dict[str, Any]) -> str:

    heads = [m.replace("_f", "") for m in HEADLINE]
    lines = ["| system | documents | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
    for name, sc in result["systems"].items():
        lines.append(f"| {name} | {sc['documents']} | "
                     + " | ".join(f"{sc[m]['mean']:.2f} [{sc[m]['low']:.2f}, {sc[m]['high']:.2f}]" for m in HEADLINE)
                     + " |")
    lines += ["", f"Paired bootstrap against {result['reference']} (difference of F1, 95% CI, two-sided p):", "",
              "| pair | documents | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
    for pair, by_metric in result["paired"].items():
        lines.append(f"| {pair} | {by_metric['documents']} | " + " | ".join(
            f"{by_metric[m]['diff']:+.2f} [{by_metric[m]['low']:+.2f}, {by_metric[m]['high']:+.2f}] "
            + format_p(by_metric[m]["p_value"], by_metric[m]["resamples"]) for m in HEADLINE) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        if len(args.reports) < 2:
            raise UserError("hibert compare: name at least two reports (the first is the reference)")
        result = compare(args.reports, args.split, args.bootstrap)
    except UserError as e:
        print(e, file=sys.stderr)
        return 1
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0
