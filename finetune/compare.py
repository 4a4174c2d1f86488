"""`hibert compare`: paired bootstrap between evaluation reports already written, without decoding again.

Each argument names a report (`report.json`, its directory, or a run directory holding
`report-<split>/report.json`), optionally `NAME=` in front and `#SYSTEM` behind to pick a row other than the
model (`lead=runs/mds/mds-hibert#lead_ranked`). Reports given the same NAME are one system trained with
different seeds (`pre=runs/seed{1,2,3}/ext` in bash): its scores are averaged over seeds per document, the
table gives the spread of its per-seed means (mean ± sd), and the paired test resamples documents and seeds.
Only an explicit NAME pools: an unnamed report is its own system, named after its run directory (with parent
directories in front where two would share a name: exp1/ext, exp2/ext); the same report (and row) listed twice
is refused. NAME is what comes before the first "=", when it holds no "/" (`lr=runs/sweep/lr=1e-4`).
The first system is the reference: every other one is paired with it over the documents all their reports
hold (by document id), F1 of ROUGE-1/2/L/Lsum, difference with its 95% CI, a two-sided p-value and what the
interval allows one to say ("no measurable difference" where it crosses 0).
Unit-ranking reports (`finetune.task=ranker`) are paired the same way per cluster, on their ROUGE-L recall of
the top L' units at every cut (`recall@5` ...); their rows are `ranker` (default), `tfidf`, `document_order`,
`oracle`. Every system of one comparison must be of the same kind.
`--results FILE` also writes the comparison as data for the docs' tables (finetune/results_file.py,
docs/results/README.md); reports of models trained at different commits are refused there unless
`--allow-mixed-commits`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hibert.errors import UserError
from hibert.finetune.evaluation.report import HEADLINE, find_report, split_name, unique_labels
from hibert.finetune.evaluation.rouge import bootstrap_ci, format_p, seeded_paired_bootstrap, verdict


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("reports", nargs="+", metavar="[NAME=]PATH[#SYSTEM]",
                   help="reports to pair; the first is the reference (SYSTEM: a row of that report, default model)")
    p.add_argument("--split", default="test", help="for run directories: read report-<split>/report.json")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the table as JSON")
    p.add_argument("--results", default=None, metavar="FILE",
                   help="also write a results file (docs/results/<name>.json, schema hibert-results/1: scores, "
                        "per-document scores, runs and commits) that docs/tables.py renders into the docs")
    p.add_argument("--allow-mixed-commits", action="store_true",
                   help="write --results even when the reports' models were made at different commits")


def load_system(item: str, split: str) -> tuple[str, dict[str, Any], list[str], Path, str, Path]:
    """(NAME or "", {metric: per-document F1}, document ids, report.json, row, run directory) of one
    `[NAME=]PATH[#SYSTEM]`."""
    spec, _, system = item.partition("#")
    name, path = split_name(spec)
    found = find_report(path, split)
    if found is None:
        raise UserError(f"hibert compare: report {item!r}: no report.json there (run `hibert evaluate` for that run "
                        "first)")
    report = json.loads(found.read_text())
    where = Path(path).resolve()
    where = where.parent if where.suffix == ".json" else where
    run_dir = where.parent if where.name.startswith("report-") else where   # named after the run
    ranking = "per_cluster" in report  # a unit-ranking report: recall of the top L' units per cluster
    own = "ranker" if ranking else "model"
    system = system or own
    per_doc = report.get("per_cluster" if ranking else "per_document", {})
    if system not in per_doc:
        raise UserError(f"hibert compare: {item!r}: the report has no per-document scores for {system!r} "
                         f"(it has {', '.join(k for k in per_doc if k != 'doc_ids') or 'none'})")
    scores = {f"recall@{cut}": v for cut, v in per_doc[system].items()} if ranking else per_doc[system]
    return name, scores, per_doc["doc_ids"], found, system, run_dir


RESULTS_SCHEMA = "hibert-results/1"


def _results_file(path: str) -> dict[str, Any] | None:
    """A results file (`hibert compare --results`) named as an input, else None."""
    p = Path(path)
    if p.suffix != ".json" or not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == RESULTS_SCHEMA else None


def load_items(item: str, split: str) -> list[tuple[str, dict[str, Any], list[str], Path, str, Path, dict | None]]:
    """The seeds one `[NAME=]PATH[#SYSTEM]` names: one report, or every seed of SYSTEM in a results file (what
    a committed unit of an experiment keeps: its per-document scores per seed), each with the facts the file
    recorded for it (None for a report, whose facts are read from its run)."""
    spec, _, system = item.partition("#")
    name, path = split_name(spec)
    data = _results_file(path)
    if data is None:
        return [(*load_system(item, split), None)]
    if data.get("split") != split:
        raise UserError(f"hibert compare: {item!r}: a results file of the {data.get('split')!r} split, not {split!r}")
    if system not in data.get("systems", {}):
        raise UserError(f"hibert compare: {item!r}: name a system of the results file after '#' (it has "
                        f"{', '.join(data.get('systems', {})) or 'none'})")
    row = data["systems"][system]
    per_doc, runs = row["per_document"], row.get("runs") or [{}] * row["seeds"]
    metrics = [m for m in per_doc if m != "doc_ids"]
    found = Path(path).resolve()
    return [(name, {m: per_doc[m][i] for m in metrics}, per_doc["doc_ids"], found, f"{system}#{i}",
             Path(run.get("run_dir") or found.parent), {**run, "row": run.get("row", system)})
            for i, run in enumerate(runs)]


def metrics_of(groups: dict[str, list[tuple[dict[str, Any], list[str]]]]) -> tuple[str, ...]:
    """ROUGE F1 for summaries, recall at each cut for unit rankings; one kind per comparison."""
    kinds = {tuple(HEADLINE) if all(m in scores for m in HEADLINE) else tuple(scores)
             for runs in groups.values() for scores, _ in runs}
    if len(kinds) != 1:
        raise UserError("hibert compare: the reports are of different kinds (summaries and unit rankings, or "
                        "rankings cut at other L'): compare like with like")
    return kinds.pop()


def group_seeds(items: list[str], split: str, sources: dict[str, list[dict[str, Any]]] | None = None
                ) -> dict[str, list[tuple[dict[str, Any], list[str]]]]:
    """{system name: [(per-document scores, document ids) of each of its seeds]}, in the order first named.
    Reports pool as seeds only under one explicit NAME; unnamed ones get unique names. `sources`, when given,
    receives {system name: [{item, report, row, run_dir} of each seed]}: what a results file records."""
    expanded = [(item, got) for item in items for got in load_items(item, split)]
    items = [item for item, _ in expanded]
    pooled = [got[6] for _, got in expanded]
    loaded = [got[:6] for _, got in expanded]
    seen: dict[tuple[Path, str], str] = {}
    for item, (_, _, _, found, system, _) in zip(items, loaded):
        if (found, system) in seen:   # one run counted twice would pass for two agreeing seeds
            raise UserError(f"hibert compare: {item!r} and {seen[found, system]!r} are one report ({found}"
                            + (f", row {system}" if system not in ("model", "ranker") else "") + ") listed twice")
        seen[found, system] = item
    own = {"model", "ranker"}
    unnamed = [i for i, x in enumerate(loaded) if not x[0]]
    labels = unique_labels([loaded[i][5] for i in unnamed],
                           ["" if loaded[i][4] in own else f"#{loaded[i][4]}" for i in unnamed],
                           taken={x[0] for x in loaded if x[0]})
    names = [x[0] for x in loaded]
    for i, label in zip(unnamed, labels):
        names[i] = label
    groups: dict[str, list[tuple[dict[str, Any], list[str]]]] = {}
    for item, name, (_, scores, ids, found, row, run_dir), facts in zip(items, names, loaded, pooled):
        groups.setdefault(name, []).append((scores, ids))
        if sources is not None:
            src = {"item": item, "report": found, "row": row, "run_dir": run_dir}
            if facts is not None:   # a seed of a results file: its facts as that file recorded them
                src.update(row=facts["row"], pooled=facts)
            sources.setdefault(name, []).append(src)
    return groups


def common_scores(runs: list[tuple[dict[str, Any], list[str]]], metric: str, ids: list[str]) -> np.ndarray:
    """[seeds, len(ids)] scores of one system's seeds on the documents `ids`."""
    return np.stack([np.asarray(scores[metric], dtype=np.float64)[[{d: i for i, d in enumerate(own)}[d] for d in ids]]
                     for scores, own in runs])


def shared_ids(*groups: list[tuple[dict[str, Any], list[str]]]) -> list[str]:
    """Document ids every report of every group holds, in the first report's order."""
    first = groups[0][0][1]
    held = set(first)
    for runs in groups:
        for _, ids in runs:
            held &= set(ids)
    return [d for d in first if d in held]


def seed_scores(groups: dict[str, list[tuple[dict[str, Any], list[str]]]], metrics: list[str]) -> dict[str, Any]:
    """{system: {"doc_ids": the documents its seeds share, metric: [seeds][documents] scores}}, rounded to 4
    decimals as the reports are: what a results file keeps to rerun the paired tests without the reports."""
    out = {}
    for name, runs in groups.items():
        ids = shared_ids(runs)
        out[name] = {"doc_ids": ids, **{m: common_scores(runs, m, ids).round(4).tolist() for m in metrics}}
    return out


def compare(items: list[str], split: str, n_resamples: int) -> dict[str, Any]:
    return compare_groups(group_seeds(items, split), n_resamples)


def compare_groups(groups: dict[str, list[tuple[dict[str, Any], list[str]]]], n_resamples: int) -> dict[str, Any]:
    if len(groups) < 2:
        raise UserError("hibert compare: name at least two systems (reports under one NAME are its seeds)")
    names = list(groups)
    ref_name = names[0]
    metrics = metrics_of(groups)
    out: dict[str, Any] = {"reference": ref_name, "metrics": list(metrics), "systems": {}, "paired": {}}
    for name, runs in groups.items():
        ids = shared_ids(runs)
        if not ids:
            raise UserError(f"hibert compare: the {len(runs)} reports of {name} share no documents")
        row: dict[str, Any] = {"documents": len(ids), "seeds": len(runs)}
        for m in metrics:
            per_seed = common_scores(runs, m, ids)                  # [seeds, documents]
            seed_means = per_seed.mean(1)
            low, high = bootstrap_ci(per_seed.mean(0), n_resamples)
            row[m] = {"mean": float(seed_means.mean()), "low": low, "high": high,
                      "seed_means": [float(x) for x in seed_means],
                      "seed_sd": float(seed_means.std(ddof=1)) if len(runs) > 1 else None}
        out["systems"][name] = row
    for name in names[1:]:
        ids = shared_ids(groups[ref_name], groups[name])
        if not ids:
            raise UserError(f"hibert compare: {name} shares no documents with {ref_name}")
        pair: dict[str, Any] = {"documents": len(ids), "seeds": [len(groups[name]), len(groups[ref_name])]}
        for m in metrics:
            pair[m] = seeded_paired_bootstrap(common_scores(groups[name], m, ids),
                                              common_scores(groups[ref_name], m, ids), n_resamples)
            pair[m]["verdict"] = verdict(pair[m]["low"], pair[m]["high"])
        out["paired"][f"{name}-{ref_name}"] = pair
    return out


def render(result: dict[str, Any]) -> str:
    metrics = tuple(result.get("metrics", HEADLINE))
    heads = [m.replace("_f", "") for m in metrics]
    what = "F1" if metrics == tuple(HEADLINE) else "ROUGE-L recall of the top L' units"
    lines = ["| system | documents | seeds | " + " | ".join(heads) + " |", "|---|---|---|" + "---|" * len(heads)]
    for name, sc in result["systems"].items():
        def cell(m: str) -> str:
            text = f"{sc[m]['mean']:.2f} [{sc[m]['low']:.2f}, {sc[m]['high']:.2f}]"
            return text + (f" ± {sc[m]['seed_sd']:.2f}" if sc[m]["seed_sd"] is not None else "")
        lines.append(f"| {name} | {sc['documents']} | {sc['seeds']} | " + " | ".join(cell(m) for m in metrics) + " |")
    lines += ["", "Mean over seeds and documents [95% CI over documents] ± sd of the per-seed means.", "",
              f"Paired bootstrap against {result['reference']} over documents and seeds (difference of {what}, 95% "
              "CI, two-sided p):", "",
              "| pair | documents | seeds | " + " | ".join(heads) + f" | {heads[0].replace('rouge1', 'ROUGE-1')} reads |",
              "|---|---|---|" + "---|" * (len(heads) + 1)]
    for pair, by_metric in result["paired"].items():
        lines.append(f"| {pair} | {by_metric['documents']} | {'/'.join(map(str, by_metric['seeds']))} | " + " | ".join(
            f"{by_metric[m]['diff']:+.2f} [{by_metric[m]['low']:+.2f}, {by_metric[m]['high']:+.2f}] "
            + format_p(by_metric[m]["p_value"], by_metric[m]["resamples"]) for m in metrics)
            + f" | {by_metric[metrics[0]]['verdict']} |")
    if any(sc["seeds"] == 1 for sc in result["systems"].values()):
        lines += ["", "One seed behind some system: its interval carries document variance only, and a second seed "
                      "of the same model can move it by more than the differences above; do not read an "
                      "ordering from it."]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from hibert.finetune.results_file import check_one_commit, command_line, model_commits, write_results

    sources: dict[str, list[dict[str, Any]]] = {}
    try:
        groups = group_seeds(args.reports, args.split, sources)
        if args.results:   # before the bootstrap: a mixed set is refused without waiting for it
            model_commits(sources)
            check_one_commit(sources, args.allow_mixed_commits)
        result = compare_groups(groups, args.bootstrap)
    except UserError as e:
        print(e, file=sys.stderr)
        return 1
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.results:
        path = write_results(Path(args.results), result, seed_scores(groups, result["metrics"]), sources,
                             command_line(args), args.split)
        print(f"results: {path}")
    return 0
