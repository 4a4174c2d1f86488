"""Soak: one 2-node pretraining job on the local Slurm cluster (.ci/slurm_up.sh) interrupted N times at random
steps — SIGUSR1 (preemption: checkpoint, exit 75, requeue) and kill -9 of a random rank (the step fails and the
job requeues itself, `slurm.max_restarts`), some of the kills while a checkpoint is being written — must end
with weights bit-identical to the same job run without interruption. Reports the wall-clock overhead.

    python benchmarks/soak_slurm.py --interruptions 20            # ~10 min on 2 cores
    -> benchmarks/results/soak_slurm.json (machine, every interruption, overhead, identical: true)

The test suite runs the same driver with 3 interruptions (tests/test_slurm_pretrain.py). It needs the
cluster's nodes on this machine (it finds a rank's pid in /proc to kill it).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
LOCAL = dict(gpus_per_node=0, cpus_per_task=1, time="00:30:00", signal_grace_s=30, nodes=2)


def training_overrides(root: Path, dataset: Path, steps: int) -> list[str]:
    """A tiny model, a checkpoint every 2 steps (so kills often land in a save), logging every step."""
    over = {"model": "hibert_tiny", "model.dropout": 0.0, "run.output_dir": root, "run.name": "soak",
            "run.stage": "open-domain", "data.dataset": dataset, "data.num_workers_loader": 1,
            "schedule.batch_tokens": 1500, "schedule.max_docs_per_batch": 16, "schedule.warmup_steps": 2,
            "schedule.log_every": 1, "schedule.eval_every": 0, "schedule.epochs": 1000,
            "schedule.max_steps": steps, "optimizer.lr": 1e-3, "checkpoint.every_steps": 2,
            "checkpoint.keep_last": 3, "checkpoint.keep_best": 0, "deepspeed.zero_stage": 2,
            "tracking.register_model": "false"}
    return [f"{k}={v}" for k, v in over.items()]


class Job:
    """One sbatch job rendered from the project's template, and what its logs say."""

    def __init__(self, work: Path, command: list[str], max_restarts: int):
        from hibert.config.ops import SlurmResources
        from hibert.slurm.render import JobSpec, write_job

        self.work = work
        self.spec = JobSpec(name="soak", command=command, log_dir=work / "logs", workdir=REPO,
                            resources=SlurmResources(**LOCAL, max_restarts=max_restarts))
        script = write_job(self.spec, work / "soak.sbatch")
        out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed: {out.stderr.strip()}")
        self.id = out.stdout.strip().split(";")[0]
        self.started = time.monotonic()

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in
                         (self.spec.log_dir / f"soak-{self.id}.{e}" for e in ("out", "err")) if p.is_file())

    def show(self) -> dict[str, str]:
        out = subprocess.run(["scontrol", "show", "job", "-o", self.id], capture_output=True, text=True, timeout=30)
        return dict(re.findall(r"(\w+)=(\S*)", out.stdout)) if out.returncode == 0 else {}

    def wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            state = self.show().get("JobState")
            if state in TERMINAL:
                raise RuntimeError(f"job {self.id} ended ({state}) while waiting for {what}\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.log()[-3000:]}")
            time.sleep(0.05)

    def wait_done(self, timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.show()
            if info.get("JobState") in TERMINAL:
                return info
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {self.id} not done after {timeout:.0f} s\n{self.log()[-3000:]}")
            time.sleep(0.5)

    def cancel(self) -> None:
        subprocess.run(["scancel", self.id], capture_output=True, timeout=30)

    # what the current attempt has done: each attempt's training log starts with the run banner
    BANNER = re.compile(r"hibert\.train: run -{20,}$", re.M)

    def err(self) -> str:
        p = self.spec.log_dir / f"soak-{self.id}.err"
        return p.read_text(errors="replace") if p.is_file() else ""

    def attempts(self) -> int:
        return len(self.BANNER.findall(self.err()))

    def last_step(self) -> int:
        """The newest step the current attempt logged (0 before its first)."""
        text = self.err()
        starts = [m.start() for m in self.BANNER.finditer(text)]
        steps = re.findall(r"hibert\.train: step (\d+)/", text[starts[-1]:] if starts else text)
        return int(steps[-1]) if steps else 0


def task_pid(job_id: str, rank: int) -> int | None:
    """The pid of task `rank` of a job (the hibert process itself, not its DataLoader workers)."""
    found: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(kv.split("=", 1) for kv in (proc / "environ").read_text().split("\0") if "=" in kv)
            cmd = (proc / "cmdline").read_text()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        argv = cmd.split("\0")
        # srun itself carries the batch step's SLURM_PROCID=0 and the same command line: not a task
        if Path(argv[0]).name == "srun" or "hibert.cli" not in argv:
            continue
        if env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_PROCID") == str(rank):
            found[int(proc.name)] = ppid
    roots = [pid for pid, ppid in found.items() if ppid not in found]
    return roots[0] if len(roots) == 1 else None


def saving(checkpoints: Path) -> bool:
    """A checkpoint tag is being written: its directory exists, its completion marker does not yet."""
    return checkpoints.is_dir() and any(p.is_dir() and p.name.startswith("step_") and not (p / "COMPLETE.json").exists()
                                        and not p.name.endswith("_universal") for p in checkpoints.iterdir())


def soak(dataset: Path, work: Path, interruptions: int, steps: int, seed: int = 0,
         kinds: list[str] | None = None, say: Callable[[str], None] = print) -> dict:
    """Run the reference job, then the interrupted one; return what happened and whether they are equal."""
    import torch
    from safetensors.torch import load_file

    rng = random.Random(seed)
    command = [sys.executable, "-m", "hibert.cli", "pretrain"]
    ref = Job(work / "reference", command + training_overrides(work / "reference" / "runs", dataset, steps), 0)
    try:
        info = ref.wait_done(timeout=60 * 30)
    finally:
        ref.cancel()
    if info.get("JobState") != "COMPLETED":
        raise RuntimeError(f"reference job {info.get('JobState')}\n{ref.log()[-3000:]}")
    reference_s = time.monotonic() - ref.started
    say(f"reference (uninterrupted): {reference_s:.1f} s")

    kinds = kinds or [rng.choice(["usr1", "kill9", "kill9-during-save"]) for _ in range(interruptions)]
    events = []
    root = work / "soak" / "runs"
    job = Job(work / "soak", command + training_overrides(root, dataset, steps),
              max_restarts=sum(k.startswith("kill9") for k in kinds))
    try:
        for i, kind in enumerate(kinds):
            job.wait(f"attempt {i + 1} to run", lambda: job.attempts() == i + 1 and job.last_step() > 0, 300)
            target = min(steps - 2, job.last_step() + rng.randint(1, 4))
            job.wait(f"step {target}", lambda: job.last_step() >= target, 300)
            event = {"n": i + 1, "kind": kind, "at_step": job.last_step(), "during_save": False}
            if kind == "usr1":
                subprocess.run(["scancel", "--signal=USR1", "--batch", job.id], check=True, timeout=30)
            else:
                if kind == "kill9-during-save":
                    deadline = time.monotonic() + 20
                    while not saving(root / "soak" / "checkpoints") and time.monotonic() < deadline:
                        time.sleep(0.002)
                    event["during_save"] = saving(root / "soak" / "checkpoints")
                rank = rng.randint(0, 1)
                pid = task_pid(job.id, rank)
                if pid is None:
                    raise RuntimeError(f"rank {rank} of job {job.id} not found in /proc")
                os.kill(pid, signal.SIGKILL)
                event["rank"] = rank
            events.append(event)
            say(f"interruption {i + 1}/{len(kinds)}: {kind} at step {event['at_step']}"
                + (" (while a checkpoint was being written)" if event["during_save"] else ""))
        info = job.wait_done(timeout=60 * 30)
    finally:
        job.cancel()
    soak_s = time.monotonic() - job.started
    text = job.log()
    resumed = [int(s) for s in re.findall(r"resumed from \S+step_0*(\d+) at step", text)]
    a = load_file(str(work / "reference" / "runs" / "soak" / "export" / "encoder.safetensors"))
    b_path = root / "soak" / "export" / "encoder.safetensors"
    b = load_file(str(b_path)) if b_path.is_file() else {}
    identical = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return {"interruptions": len(kinds), "steps": steps, "seed": seed, "state": info.get("JobState"),
            "restarts": int(info.get("Restarts", -1)), "events": events, "resumed_at": resumed,
            "kills_during_save": sum(e["during_save"] for e in events),
            "reference_s": round(reference_s, 1), "soak_s": round(soak_s, 1),
            "overhead": round(soak_s / reference_s, 2), "identical": identical,
            "lost_rank_named": len(re.findall(r"task \d: Killed", text)),
            "log_tail": text[-2000:] if not identical or info.get("JobState") != "COMPLETED" else ""}


def prepare(work: Path) -> Path:
    """The shipped Reuters sample (80 documents), prepared as the tests prepare it."""
    out = work / "data" / "open"
    if (out / "manifest.json").is_file():
        return out
    lines = (REPO / "samples" / "reuters_sample.jsonl").read_text(encoding="utf-8").splitlines()[:80]
    src = work / "data" / "reuters.jsonl"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "hibert.cli", "prep", "data.tokenizer.vocab_size=600",
                    "data.valid_fraction=0.1", "data.test_fraction=0.0", f"data.output={out}",
                    f"data.sources=[{{format: jsonl, path: '{src}', text_field: body, id_field: newid}}]"],
                   check=True, capture_output=True, timeout=600)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interruptions", type=int, default=20)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hibert-soak"))
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "soak_slurm.json")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "benchmarks"))
    from workload import machine

    import shutil

    shutil.rmtree(args.work / "reference", ignore_errors=True)
    shutil.rmtree(args.work / "soak", ignore_errors=True)
    result = soak(prepare(args.work), args.work, args.interruptions, args.steps, args.seed)
    result = {"machine": machine(), "command": " ".join(sys.argv), **result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'interruptions':<22}{result['interruptions']} ({sum(e['kind'] == 'usr1' for e in result['events'])} "
          f"USR1, {sum(e['kind'] != 'usr1' for e in result['events'])} kill -9, "
          f"{result['kills_during_save']} during a checkpoint save)")
    print(f"{'job state':<22}{result['state']} after {result['restarts']} restarts")
    print(f"{'wall clock':<22}{result['soak_s']} s vs {result['reference_s']} s uninterrupted "
          f"({result['overhead']}x)")
    print(f"{'bit-identical':<22}{result['identical']}")
    print(f"-> {args.out}")
    return 0 if result["identical"] and result["state"] == "COMPLETED" else 1


if __name__ == "__main__":
    sys.exit(main())
