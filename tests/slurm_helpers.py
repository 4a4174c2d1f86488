"""Real-Slurm test helpers: the `slurm_cluster` fixture (skips when no slurmctld answers) and a small
client over sbatch/scontrol/scancel. No accounting database is assumed: job state comes from
`scontrol show job` (kept MinJobAge seconds after the end) and from the jobs' own output files.

Tests pass the command each job runs, so a stand-in program and the real `hibert pretrain` go
through the same rendered script (slurm/templates/job.sbatch).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hibert.config.ops import SlurmResources
from hibert.slurm.render import JobSpec, write_job

REPO = Path(__file__).resolve().parents[1]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}
# Resources that fit the local two-node cluster (.ci/slurm_up.sh): one CPU per node, no GPUs.
LOCAL = dict(gpus_per_node=0, cpus_per_task=1, time="00:05:00", signal_grace_s=30)


def _run(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def controller_problem() -> str | None:
    """None when a Slurm controller answers, else why not."""
    if not shutil.which("scontrol"):
        return "Slurm is not installed (no scontrol); run .ci/slurm_up.sh to set up the local cluster"
    try:
        out = _run("scontrol", "ping", timeout=15)
    except subprocess.TimeoutExpired:
        return "`scontrol ping` timed out; start the local cluster with .ci/slurm_up.sh"
    if out.returncode != 0 or "is UP" not in out.stdout:
        lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip() and not ln.startswith("*")]
        return f"slurmctld not reachable ({lines[0] if lines else 'no answer'}); start it with .ci/slurm_up.sh"
    return None


class Cluster:
    """The jobs a test submits; all of them are cancelled at teardown so no test inherits busy nodes."""

    def __init__(self) -> None:
        self.jobs: list[str] = []

    def sbatch(self, script: Path, *options: str) -> str:
        out = _run("sbatch", "--parsable", *options, str(script))
        assert out.returncode == 0, f"sbatch failed: {out.stderr}"
        job_id = out.stdout.strip().split(";")[0]
        self.jobs.append(job_id)
        return job_id

    def submit(self, tmp: Path, name: str, command: list[str], **resources) -> tuple[str, JobSpec]:
        """Render `command` through the project's sbatch template and submit it."""
        spec = JobSpec(name=name, command=command, resources=SlurmResources(**{**LOCAL, **resources}),
                       log_dir=tmp / "logs", workdir=REPO)
        return self.sbatch(write_job(spec, tmp / f"{name}.sbatch")), spec

    def track(self, job_ids: list[str]) -> None:
        self.jobs += job_ids

    def show(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o` as a dict (values are the first word after `Key=`)."""
        out = _run("scontrol", "show", "job", "-o", job_id)
        assert out.returncode == 0, f"scontrol show job {job_id}: {out.stderr}"
        return dict(re.findall(r"(\w+)=(\S*)", out.stdout))

    def states(self, job_id: str) -> list[str]:
        """JobState of every record of the job: one per task for a job array."""
        out = _run("scontrol", "show", "job", "-o", job_id)
        assert out.returncode == 0, f"scontrol show job {job_id}: {out.stderr}"
        return re.findall(r"\bJobState=(\S+)", out.stdout)

    def hosts(self, job_id: str) -> list[str]:
        """BatchHost of every record of the job (one per array task)."""
        out = _run("scontrol", "show", "job", "-o", job_id)
        assert out.returncode == 0, f"scontrol show job {job_id}: {out.stderr}"
        return re.findall(r"\bBatchHost=(\S+)", out.stdout)

    def wait_until(self, what: str, check: Callable[[], bool], timeout: float, poll: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(poll)

    def wait_done(self, job_id: str, timeout: float) -> dict[str, str]:
        """Block until the job reaches a terminal state (a requeued job passes through PENDING)."""
        info: dict[str, str] = {}

        def done() -> bool:
            info.update(self.show(job_id))
            return info.get("JobState") in TERMINAL

        try:
            self.wait_until(f"job {job_id} to finish", done, timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}; last state {info.get('JobState')} reason {info.get('Reason')}") from None
        return info

    def signal(self, job_id: str, sig: str, *flags: str) -> None:
        out = _run("scancel", f"--signal={sig}", *flags, job_id)
        assert out.returncode == 0, f"scancel --signal={sig} {flags}: {out.stderr}"

    def cancel_all(self) -> None:
        if self.jobs:
            _run("scancel", *self.jobs)


@pytest.fixture
def slurm_cluster() -> Iterator[Cluster]:
    problem = controller_problem()
    if problem:
        pytest.skip(problem)
    cluster = Cluster()
    try:
        yield cluster
    finally:
        cluster.cancel_all()


def log_text(log_dir: Path, name: str, job_id: str) -> str:
    """Both output files of a non-array job (%x-%j.out / .err)."""
    parts = [log_dir / f"{name}-{job_id}.{ext}" for ext in ("out", "err")]
    return "\n".join(p.read_text() for p in parts if p.exists())


def python_command(program: Path, *args: str) -> list[str]:
    """The interpreter running the tests, executing `program` itself (signals reach it directly)."""
    return [sys.executable, str(program), *args]
