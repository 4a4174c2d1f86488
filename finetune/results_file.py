"""`hibert compare --results FILE`: one comparison as data (schema "hibert-results/1"), so that the docs' tables
are rendered from it (docs/tables.py) instead of typed by hand.

The file holds what the table shows (per system: per-seed means, mean ± sd, the bootstrap CI; the paired
differences with CI, p and what they allow one to say), what it takes to rerun the paired tests without the
reports (document ids and per-document scores, one array per seed, rounded to 4 decimals: kilobytes), and where
it comes from: each seed's run directory, report and the commit its model was trained at (export.json's
git_commit), the commit of the code that wrote the file, whether that tree was clean, the command line and the
UTC date. A table names one commit, so reports of models made at different commits are refused unless asked.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from hibert.errors import UserError
from hibert.runtime.tracking import code_revision

SCHEMA = "hibert-results/1"
UNKNOWN = "unknown"
REPO = Path(__file__).resolve().parents[1]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def model_export(report_path: Path, run_dir: Path) -> dict[str, Any] | None:
    """The export.json of the reported model: the export the report names (`meta.model`, a local export
    directory), else the run's own export when it is the evaluated one (its MLflow run is the report's
    `finetune_run`, or the report names none); None when neither is at hand."""
    meta = (_read_json(report_path) or {}).get("meta") or {}
    model = str(meta.get("model") or "")
    if model and ":/" not in model:   # models:/name@alias or a URI: its export.json is in the artifact store
        named = _read_json(Path(model) / "export.json")
        if named is not None:
            return named
    own = _read_json(run_dir / "export" / "export.json")
    if own is not None and (not meta.get("finetune_run") or own.get("mlflow_run_id") == meta["finetune_run"]):
        return own
    return None


def model_commit(report_path: Path, run_dir: Path) -> str:
    """The commit the reported model was trained at: the report's own `meta.git_commit` where it has one, else
    its export's (`model_export`)."""
    meta = (_read_json(report_path) or {}).get("meta") or {}
    if meta.get("git_commit"):
        return str(meta["git_commit"])
    export = model_export(report_path, run_dir)
    return str(export.get("git_commit") or UNKNOWN) if export is not None else UNKNOWN


def run_facts(report_path: Path, run_dir: Path, row: str) -> dict[str, Any]:
    """What a table shows beside the scores, for the report's `row`: the trained model's validation metrics at
    its last step (`last_valid`, its export's `final_metrics`; the model's own row only, a baseline was not
    trained) and the mean words of the row's outputs (`words`, summaries only)."""
    facts: dict[str, Any] = {}
    if row in ("model", "ranker"):
        export = model_export(report_path, run_dir)
        final = (export or {}).get("final_metrics")
        if isinstance(final, dict) and final:
            facts["last_valid"] = {k: v for k, v in final.items() if isinstance(v, (int, float))}
        if (seconds := run_seconds(run_dir, (export or {}).get("mlflow_run_id"))) is not None:
            facts["seconds"] = seconds
    words = ((_read_json(report_path) or {}).get("abstractiveness") or {}).get(row, {}).get("mean_words")
    if isinstance(words, (int, float)):
        facts["words"] = words
    if row in ("model", "ranker") and (encoder := encoder_facts(run_dir)) is not None:
        facts["encoder"] = encoder
    return facts


def encoder_facts(run_dir: Path) -> dict[str, Any] | None:
    """The pretrained encoder a finetuning started from, as the run copied it (`<run>/init/export.json`, the
    export `run.init` resolved to): its MLflow run, stage, the init it continued, its last step, its validation
    metrics there (`last_valid`: the pretraining objective on its validation split) and the commit it was
    trained at. None for a random start (no init copy)."""
    export = _read_json(run_dir / "init" / "export.json")
    if export is None:
        return None
    final = export.get("final_metrics") if isinstance(export.get("final_metrics"), dict) else {}
    facts = {"run": export.get("mlflow_run_id"), "stage": export.get("stage"), "init": export.get("init") or "random",
             "step": export.get("step"), "model_commit": str(export.get("git_commit") or UNKNOWN),
             "last_valid": {k: v for k, v in final.items() if isinstance(v, (int, float))}}
    if (seconds := run_seconds(run_dir, export.get("mlflow_run_id"))) is not None:
        facts["seconds"] = seconds
    return facts


def run_seconds(run_dir: Path, run_id: str | None) -> float | None:
    """How long an MLflow run took (its end time less its start time: the whole training process, set-up and
    export included), read from the store the run directory's config names (an encoder's run: the store its
    finetuning resolved it from). None where the run, its store or its end is not at hand; a missing sqlite store
    is not created."""
    from hibert.registry import reachable, sqlite_path, tracking_uri

    try:
        cfg = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
        output_dir = Path(cfg["run"]["output_dir"])
        # a run directory is <output_dir>/<run.name>: its own parent, wherever compare runs from
        if not output_dir.is_absolute() and run_dir.name == cfg["run"].get("name"):
            output_dir = run_dir.parent
        uri = tracking_uri(cfg["tracking"]["uri"], output_dir, create=False)
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    db = sqlite_path(uri)
    if not run_id or (db is not None and not db.is_file()):
        return None
    if db is None and not (uri.startswith(("http://", "https://")) and _cached(_REACHABLE, uri, reachable)):
        return None   # a server that does not answer now, or another database: a time is not worth a stall
    from mlflow.tracking import MlflowClient

    try:
        info = _cached(_CLIENTS, uri, MlflowClient).get_run(run_id).info
    except Exception:  # noqa: BLE001 - a time beside the scores is best effort: never lose the comparison for it
        return None
    return (info.end_time - info.start_time) / 1000 if info.end_time and info.start_time else None


_REACHABLE: dict[str, Any] = {}
_CLIENTS: dict[str, Any] = {}


def _cached(cache: dict[str, Any], uri: str, make: Any) -> Any:
    """One probe and one client per store for a whole comparison (each run and its encoder ask)."""
    if uri not in cache:
        cache[uri] = make(uri)
    return cache[uri]


def run_seed(run_dir: Path) -> int | None:
    """`run.seed` of the run's resolved config (None where the run directory has none)."""
    try:
        cfg = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    seed = (cfg or {}).get("run", {}).get("seed") if isinstance(cfg, dict) else None
    return seed if isinstance(seed, int) else None


def model_commits(sources: dict[str, list[dict[str, Any]]]) -> None:
    """Add each seed's `model_commit`, `seed` and `run_facts` to `sources` (as `group_seeds` filled it)."""
    for runs in sources.values():
        for run in runs:
            if "pooled" in run:   # a seed of a results file: what it recorded, its runs long gone perhaps
                kept = run.pop("pooled")
                run["model_commit"], run["seed"] = kept.get("model_commit", UNKNOWN), kept.get("seed")
                run["facts"] = {k: v for k, v in kept.items()
                                if k not in ("run_dir", "report", "row", "seed", "model_commit")}
                continue
            run["model_commit"] = model_commit(Path(run["report"]), Path(run["run_dir"]))
            run["seed"] = run_seed(Path(run["run_dir"]))
            run["facts"] = run_facts(Path(run["report"]), Path(run["run_dir"]), run["row"])


def check_one_commit(sources: dict[str, list[dict[str, Any]]], allow_mixed: bool) -> None:
    by_commit = _by_commit(sources)
    if len(by_commit) > 1 and not allow_mixed:
        listed = "; ".join(f"{commit}: {', '.join(runs)}" for commit, runs in by_commit.items())
        raise UserError(f"hibert compare --results: the reports' models were made at {len(by_commit)} different "
                        f"commits ({listed}); a table names one commit: rerun them at one, or pass "
                        "--allow-mixed-commits to write the file anyway (it lists the commits)")


def _by_commit(sources: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for runs in sources.values():
        for run in runs:
            where = _rel(run["run_dir"])
            if where not in out.setdefault(run["model_commit"], []):
                out[run["model_commit"]].append(where)
    return out


def _rel(path: Path | str) -> str:
    """A path as the reader reruns it: relative to where the command ran."""
    return os.path.relpath(path)


def command_line(args: argparse.Namespace) -> str:
    """The command as it ran (its defaults left out; --json, which changes no number, too)."""
    argv = ["hibert", "compare", *args.reports]
    if args.split != "test":
        argv += ["--split", args.split]
    if args.bootstrap != 1000:
        argv += ["--bootstrap", str(args.bootstrap)]
    argv += ["--results", args.results] + (["--allow-mixed-commits"] if args.allow_mixed_commits else [])
    return shlex.join(argv)


def results_payload(result: dict[str, Any], per_document: dict[str, dict[str, Any]],
                    sources: dict[str, list[dict[str, Any]]], command: str, split: str) -> dict[str, Any]:
    """The results file's content from `compare_groups`'s result, each system's per-document scores
    (`seed_scores`) and where its seeds come from (`group_seeds`' sources, with `model_commits` added)."""
    metrics = result["metrics"]
    by_commit = _by_commit(sources)
    systems: dict[str, Any] = {}
    for name, row in result["systems"].items():
        systems[name] = {
            "documents": row["documents"], "seeds": row["seeds"],
            "runs": [{"run_dir": _rel(s["run_dir"]), "report": _rel(s["report"]), "row": s["row"], "seed": s["seed"],
                      "model_commit": s["model_commit"], **_rounded(s.get("facts", {}))} for s in sources[name]],
            "scores": {m: _rounded(row[m]) for m in metrics},
            **({"positions": pos} if (pos := picked_positions(sources[name])) else {}),
            "per_document": per_document[name]}
    shared = set.intersection(*(set(p["doc_ids"]) for p in per_document.values()))
    paired = {key: {"system": key[: -len(result["reference"]) - 1], "reference": result["reference"], **_rounded(pair)}
              for key, pair in result["paired"].items()}
    resamples = next((p[m]["resamples"] for p in result["paired"].values() for m in metrics), None)
    return {"schema": SCHEMA,
            "made": {**code_revision(), "command": command, "cwd": _cwd(),
                     "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
            "model_commit": next(iter(by_commit)) if len(by_commit) == 1 else None,
            "model_commits": by_commit,
            "kind": "summaries" if metrics[0].startswith("rouge") else "unit rankings",
            "split": split, "metrics": metrics, "bootstrap": resamples, "reference": result["reference"],
            "documents": len(shared), "systems": systems, "paired": paired}


def picked_positions(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where a system's picks sit in the documents, summed over its seeds' reports (report.json `positions`, an
    extractive model's and its baselines'): {"bins": ["1", ..., "10+"], "picks": n, "counts": [...]}; None when a
    seed's report has none for its row."""
    bins, counts, picks = None, None, 0
    for run in runs:
        report = _read_json(Path(run["report"])) or {}
        mine = (report.get("positions") or {}).get("systems", {}).get(run["row"])
        if mine is None:
            return None
        if bins is not None and report["positions"]["bins"] != bins:
            return None   # seeds binned differently: not summable
        bins = report["positions"]["bins"]
        counts = [a + b for a, b in zip(counts, mine["counts"])] if counts else list(mine["counts"])
        picks += mine["picks"]
    return {"bins": bins, "picks": picks, "counts": counts} if counts else None


def _rounded(obj: Any) -> Any:
    """Floats to 6 decimals (the tables show 2): no 1.6254000000000002 in a file people read."""
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return round(obj, 6) if isinstance(obj, float) else obj


def _cwd() -> str:
    """Where the command ran, relative to the repository when inside it (the paths above are relative to it)."""
    here = Path.cwd().resolve()
    return str(here.relative_to(REPO)) if here.is_relative_to(REPO) else str(here)


def dumps(obj: Any, indent: int = 0) -> str:
    """JSON with one line per list of numbers (a seed's per-document scores), so the file reads and diffs."""
    pad = " " * (indent + 1)
    if isinstance(obj, dict) and obj:
        body = ",\n".join(f"{pad}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items())
        return "{\n" + body + "\n" + " " * indent + "}"
    if isinstance(obj, list) and any(isinstance(x, (dict, list)) for x in obj):
        return "[\n" + ",\n".join(pad + dumps(x, indent + 1) for x in obj) + "\n" + " " * indent + "]"
    return json.dumps(obj, ensure_ascii=False)


def write_results(path: Path, result: dict[str, Any], per_document: dict[str, dict[str, Any]],
                  sources: dict[str, list[dict[str, Any]]], command: str, split: str) -> Path:
    payload = results_payload(result, per_document, sources, command, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(payload) + "\n", encoding="utf-8")
    return path
