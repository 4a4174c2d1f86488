"""What a pretraining unit of an experiment leaves in the repository: its encoder export, copied where a later
checkout finds it (the finetuning units start from it there), and one JSON file of what its stages did — per
stage the steps, the masked-sentence objective's validation perplexity, tokens/s and minutes — so that the
pretraining tables are generated from data.

    python -m hibert.pretrain.encoder_record RUN_OUTPUT_DIR STAGE[,STAGE...] EXPORT_COPY RECORD_JSON [HELD_OUT]

RUN_OUTPUT_DIR is the recipe's run.output_dir (`hibert demo` writes <dir>/<stage>/ runs, <dir>/logs/<stage>.log
and <dir>/.stages/<stage>.json there); the last STAGE's export is the encoder copied. HELD_OUT, a prepared
finetuning dataset: the record says how many of its valid and test documents each stage's dataset holds (by
content hash: data_prep/overlap.py), and the unit fails when any does.
"""
from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from hibert.data_prep.overlap import overlap_report, report_lines
from hibert.errors import UserError
from hibert.runtime.tracking import code_revision

SCHEMA = "hibert-pretraining/1"
_STEP = re.compile(r"step (\d+)/(\d+) train_loss=\S+ .*?tokens/s=([\d,]+)")
_EVAL = re.compile(r"eval step (\d+)/\d+ valid_loss=(\S+) valid_ppl=(\S+)")
EXPORT_FILES = ("encoder.safetensors", "model.json", "tokenizer.model", "export.json")


def stage_record(root: Path, stage: str) -> dict[str, Any]:
    """One stage's facts from its export.json, its log (the step lines' tokens/s after the first window, which
    holds the start-up; every evaluation) and the runner's marker (its wall time)."""
    export = root / stage / "export" / "export.json"
    if not export.is_file():
        raise UserError(f"{export} is missing: stage {stage!r} has not finished (rerun the unit: it resumes)")
    meta = json.loads(export.read_text())
    log = (root / "logs" / f"{stage}.log").read_text(errors="replace")
    # the log holds every attempt (a resumed stage appends): the last attempt's lines are this export's
    attempt = log.rsplit("\n$ ", 1)[-1]
    rates = [int(m.group(3).replace(",", "")) for m in _STEP.finditer(attempt)]
    evals = [{"step": int(m.group(1)), "valid_loss": float(m.group(2)), "valid_ppl": float(m.group(3))}
             for m in _EVAL.finditer(attempt)]
    marker = root / ".stages" / f"{stage}.json"
    seconds = json.loads(marker.read_text()).get("seconds") if marker.is_file() else None
    steady = rates[1:] or rates
    return {"stage": stage, "registered_stage": meta.get("stage"), "init": meta.get("init"),
            "steps": meta.get("step"), "git_commit": meta.get("git_commit"),
            "dataset_manifest": meta.get("dataset_manifest"), "metrics": meta.get("metrics"),
            "final_metrics": meta.get("final_metrics"), "evaluations": evals,
            "tokens_per_s_median": statistics.median(steady) if steady else None,
            "tokens_per_s_windows": len(steady), "minutes": round(seconds / 60, 1) if seconds else None}


def stage_dataset(root: Path, stage: str) -> Path:
    """The prepared dataset a stage trained on (its resolved config's data.dataset, else data.output)."""
    data = yaml.safe_load((root / stage / "config.resolved.yaml").read_text())["data"]
    return Path(data.get("dataset") or data["output"])


def record(root: Path, stages: list[str], copy_to: Path, out: Path, held_out: Path | None = None) -> dict[str, Any]:
    made = code_revision()
    rec = {"schema": SCHEMA, "run_output_dir": str(root), "stages": {s: stage_record(root, s) for s in stages},
           "encoder": str(copy_to),
           "machine": {"commit": made["commit"], "tracked_changes": made["clean"] is False},
           "command": "python -m hibert.pretrain.encoder_record " + " ".join(
               [str(root), ",".join(stages), str(copy_to), str(out), *([str(held_out)] if held_out else [])])}
    if held_out is not None:
        rec["overlap"] = overlap_report([stage_dataset(root, s) for s in stages], held_out, ("valid", "test"))
        for stage, row in zip(stages, rec["overlap"]["pretraining"]):
            rec["stages"][stage]["overlap_shared"] = row["shared"]
        leaked = [r for r in rec["overlap"]["pretraining"] if r["shared"]]
        if leaked:
            raise UserError(f"pretraining data holds held-out documents of {held_out}: {leaked}")
    export = root / stages[-1] / "export"
    copy_to.mkdir(parents=True, exist_ok=True)
    for name in EXPORT_FILES:
        if (export / name).is_file():
            shutil.copy2(export / name, copy_to / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (4, 5):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        rec = record(Path(args[0]), args[1].split(","), Path(args[2]), Path(args[3]),
                     Path(args[4]) if len(args) == 5 else None)
    except UserError as e:
        print(f"encoder_record: {e}", file=sys.stderr)
        return 1
    for s in rec["stages"].values():
        print(f"{s['stage']}: {s['steps']} steps, valid ppl {(s['final_metrics'] or {}).get('valid_ppl')}, "
              f"{s['tokens_per_s_median']} tokens/s, {s['minutes']} min")
    if "overlap" in rec:
        print("\n".join(report_lines(rec["overlap"])))
    print(f"encoder: {rec['encoder']}; record: {args[3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
