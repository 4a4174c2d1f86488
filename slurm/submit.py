"""`hibert submit RECIPE [key=value ...]`: render the chain's sbatch scripts and submit them, each
stage after the previous one succeeded (`--dependency=afterok:<id>`)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from hibert.config import ConfigError
from hibert.config.schema import Config
from slurm.render import render_job, write_job
from slurm.stages import PlannedJob, plan


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the rendered scripts; submit nothing")
    p.add_argument("--stages", default=None, metavar="A,B",
                   help="comma-separated stage names to submit (default: all); dependencies on stages "
                        "left out are dropped")
    p.add_argument("--out-dir", default=None, metavar="DIR",
                   help="where scripts and job logs go (default: <run.output_dir>/<run.name>/slurm)")


def sbatch(script: Path, dependency_ids: list[str]) -> str:
    """Submit one script; returns the job id (an array's id when it is a job array)."""
    cmd = ["sbatch", "--parsable"]
    if dependency_ids:
        cmd.append("--dependency=afterok:" + ":".join(dependency_ids))
    out = subprocess.run([*cmd, str(script)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"sbatch {script} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]  # --parsable prints "id" or "id;cluster"


def submit_chain(jobs: list[PlannedJob], out_dir: Path) -> dict[str, str]:
    ids: dict[str, str] = {}
    for job in jobs:
        script = write_job(job.spec, out_dir / f"{job.stage.name}.sbatch")
        ids[job.stage.name] = sbatch(script, [ids[a] for a in job.after])
        after = f"  (afterok: {', '.join(job.after)})" if job.after else ""
        print(f"{job.stage.name:<16} job {ids[job.stage.name]:<10} {script}{after}", flush=True)
    return ids


def run(cfg: Config, args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir or cfg.run_dir / "slurm").resolve()
    only = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    try:
        jobs = plan(cfg, args.config, list(args.overrides), out_dir, Path.cwd(), only)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"hibert submit: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for job in jobs:
            after = ", ".join(job.after) or "none"
            print(f"# ===== stage {job.stage.name} (afterok: {after}) -> {out_dir / job.stage.name}.sbatch")
            print(render_job(job.spec))
        return 0
    try:
        ids = submit_chain(jobs, out_dir)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"hibert submit: {e}", file=sys.stderr)
        return 1
    (out_dir / "jobs.json").write_text(json.dumps(ids, indent=2) + "\n")
    print(f"logs: {out_dir}/<job-name>-<job-id>.out; cancel all: scancel {' '.join(ids.values())}")
    return 0
