"""`hibert submit RECIPE [key=value ...]`: render the chain's sbatch scripts and submit them, each
stage after the previous one succeeded (`--dependency=afterok:<id>`).

Every submission is a chain with an id (`<run.name>-<UTC time>-<4 hex>`): its training stages register
their models under `<alias>-<chain id>` and later stages read exactly those (slurm/chain.py); an init
from outside the chain is pinned to its registry version now. Each stage's resolved config is
snapshotted at submit time (`<out-dir>/<chain id>/<stage>.yaml`) and its job runs
`hibert <command> <snapshot>`, so editing the recipe afterwards changes no queued job.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hibert.config import ConfigError
from hibert.config.schema import Config
from hibert.redact import redact_uri
from hibert.slurm.render import render_job, write_job
from hibert.slurm.stages import Chain, plan, write_snapshots


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="print the rendered scripts and submit nothing; the stage snapshots go to a new "
                        "temporary directory (printed), nothing is written to --out-dir")
    p.add_argument("--stages", default=None, metavar="A,B",
                   help="comma-separated stage names to submit (default: all); a stage left out is taken as "
                        "done: what it waited for still comes first")
    p.add_argument("--out-dir", default=None, metavar="DIR",
                   help="where scripts, job logs, jobs.json and <chain id>/ snapshots go "
                        "(default: <run.output_dir>/<run.name>/slurm)")
    p.add_argument("--chain", default=None, metavar="ID",
                   help="continue chain ID (from jobs.json) instead of starting a new one: the stages register "
                        "and read that chain's aliases, and what its left-out stages registered is pinned now")
    p.add_argument("--no-pin", action="store_true",
                   help="do not contact the registry at submit time: a run.init from outside the chain "
                        "(models:/name@alias) stays an alias, resolved when its job starts")


def sbatch(script: Path, dependency_ids: list[str]) -> str:
    """Submit one script; returns the job id (an array's id when it is a job array)."""
    cmd = ["sbatch", "--parsable"]
    if dependency_ids:
        cmd.append("--dependency=afterok:" + ":".join(dependency_ids))
    out = subprocess.run([*cmd, str(script)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"sbatch {script} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]  # --parsable prints "id" or "id;cluster"


def submit_chain(chain: Chain, out_dir: Path, ids: dict[str, str]) -> dict[str, str]:
    """sbatch every job in order; `ids` fills up as they go (what was submitted before a failure)."""
    for job in chain.jobs:
        script = write_job(job.spec, out_dir / f"{job.stage.name}.sbatch")
        ids[job.stage.name] = sbatch(script, [ids[a] for a in job.after])
        after = f"  (afterok: {', '.join(job.after)})" if job.after else ""
        print(f"{job.stage.name:<16} job {ids[job.stage.name]:<10} {script}{after}", flush=True)
    return ids


def record(chain: Chain, out_dir: Path, ids: dict[str, str], recipe: str | None, overrides: list[str]) -> Path:
    """jobs.json: the chain id, stage -> job id, and per stage its snapshot and hand-off. Written to
    `<out-dir>/<chain id>/jobs.json` (merged over earlier submissions of the same chain) and to
    `<out-dir>/jobs.json` (the latest submission)."""
    path = chain.snapshot_dir / "jobs.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.update({"chain_id": chain.id, "recipe": recipe, "overrides": [redact_uri(o) for o in overrides],
                 "jobs": {**data.get("jobs", {}), **ids}})
    stages = data.setdefault("stages", {})
    for job in chain.jobs:
        if job.stage.name in ids:
            stages[job.stage.name] = {
                "job": ids[job.stage.name], "command": job.stage.command, "after": job.after,
                "snapshot": str(job.snapshot), "source": [redact_uri(w) for w in job.source],
                "registers": job.link.registers, "reads": job.link.reads}
    text = json.dumps(data, indent=2) + "\n"
    path.write_text(text)
    (out_dir / "jobs.json").write_text(text)
    return path


def latest_chain(out_dir: Path) -> str | None:
    try:
        return json.loads((out_dir / "jobs.json").read_text()).get("chain_id")
    except (OSError, ValueError, AttributeError):
        return None


def run(cfg: Config, args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir or cfg.run_dir / "slurm").resolve()
    only = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    snapshot_root = Path(tempfile.mkdtemp(prefix="hibert-submit-dry-run-")) if args.dry_run else out_dir
    try:
        chain = plan(cfg, args.config, list(args.overrides), out_dir, Path.cwd(), only, chain_id=args.chain,
                     continuing=bool(args.chain), pin=not args.no_pin, snapshot_root=snapshot_root)
        for job in chain.jobs:   # every script renders (no whitespace in an #SBATCH path, ...) before anything is written
            render_job(job.spec)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        if args.dry_run:
            shutil.rmtree(snapshot_root, ignore_errors=True)
        msg = str(e)
        last = latest_chain(out_dir)
        if "--chain <id>" in msg and last:
            msg += f" (the latest chain in {out_dir / 'jobs.json'}: --chain {last})"
        print(f"hibert submit: {msg}", file=sys.stderr)
        return 2
    try:
        write_snapshots(chain)
    except OSError as e:
        print(f"hibert submit: cannot write the stage snapshots to {chain.snapshot_dir}: {e}", file=sys.stderr)
        return 1
    if args.dry_run:
        print(f"# chain {chain.id} (dry run: snapshots in {chain.snapshot_dir}, nothing in {out_dir})")
        for line in chain.notes():
            print(f"#   {line}")
        for job in chain.jobs:
            after = ", ".join(job.after) or "none"
            print(f"# ===== stage {job.stage.name} (afterok: {after}) -> {out_dir / job.stage.name}.sbatch")
            print(render_job(job.spec))
        return 0
    print(f"chain {chain.id}  (snapshots: {chain.snapshot_dir})", flush=True)
    for line in chain.notes():
        print(f"  {line}")
    ids: dict[str, str] = {}
    try:
        submit_chain(chain, out_dir, ids)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"hibert submit: {e}", file=sys.stderr)
        if ids:
            record(chain, out_dir, ids, args.config, list(args.overrides))
            print(f"hibert submit: submitted before the failure: {ids}; cancel: scancel {' '.join(ids.values())}",
                  file=sys.stderr)
        return 1
    path = record(chain, out_dir, ids, args.config, list(args.overrides))
    print(f"chain {chain.id}: {path}")
    print(f"logs: {out_dir}/<job-name>-<job-id>.out; cancel all: scancel {' '.join(ids.values())}")
    return 0
