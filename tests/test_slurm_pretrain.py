"""The real `hibert pretrain` (DeepSpeed ZeRO-2 over gloo, one rank per node) on the local two-node
cluster through the project's sbatch template: ranks from SLURM_*, USR1 mid-run, checkpoint, exit 75,
requeue, resume from that checkpoint, finish and register the encoder; the short soak: kills (-9) of a rank
and USR1 mixed, the job requeuing itself (slurm.max_restarts), ending bit-identical to an uninterrupted run."""
import re
import sys
from pathlib import Path

import pytest

from conftest import tiny_train_overrides
from hibert.runtime.dist_env import REQUEUE_EXIT_CODE
from slurm_helpers import log_text, slurm_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_pretrain_preempted_requeued_and_resumed(slurm_cluster, tiny_data, tmp_path):
    overrides = tiny_train_overrides(tmp_path / "runs", "slurm-e2e", tiny_data["open"],
                                     **{"schedule.max_steps": 120, "checkpoint.every_steps": 5,
                                        "run.stage": "open-domain"})
    job, spec = slurm_cluster.submit(tmp_path, "pretrain", [sys.executable, "-m", "hibert.cli", "pretrain",
                                                            *overrides], nodes=2)

    def log() -> str:
        return log_text(spec.log_dir, "pretrain", job)

    def training() -> bool:
        assert slurm_cluster.show(job)["JobState"] in ("PENDING", "RUNNING"), log()
        return re.search(r"hibert\.train: step [5-9]/", log()) is not None

    slurm_cluster.wait_until("training to pass step 5", training, timeout=150)
    slurm_cluster.signal(job, "USR1", "--batch")
    info = slurm_cluster.wait_done(job, timeout=140)
    text = log()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", text
    saved = int(re.search(r"preempted by SIGUSR1: checkpoint at step (\d+)", text).group(1))
    assert 5 <= saved < 120
    assert f"step exited with status {REQUEUE_EXIT_CODE}" in text and f"requeueing job {job}" in text
    assert re.search(rf"resumed from \S+step_0*{saved} at step {saved}\b", text), text
    assert "pretrain finished at step 120" in text
    assert "(alias open-domain)" in text



@pytest.mark.timeout(480)
def test_soak_three_interruptions_end_bit_identical(slurm_cluster, tiny_data, tmp_path):
    """The soak (benchmarks/soak_slurm.py) cut to 3 interruptions: kill -9 of a rank while a checkpoint is
    being written, SIGUSR1, kill -9 — the job requeues itself each time (the kills through
    slurm.max_restarts), resumes from the newest complete checkpoint and ends with the weights of the same
    job run without interruption."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from soak_slurm import soak

    result = soak(tiny_data["open"], tmp_path, interruptions=3, steps=40, seed=1,
                  kinds=["kill9-during-save", "usr1", "kill9"], say=lambda _: None)
    assert result["state"] == "COMPLETED" and result["restarts"] == 3, result
    assert result["identical"], result
    assert result["lost_rank_named"] == 2, result      # srun: "task N: Killed", once per kill
    assert len(result["resumed_at"]) >= 2, result      # USR1 always leaves a checkpoint to resume from
    assert result["kills_during_save"] == 1, result


@pytest.mark.timeout(200)
def test_a_step_that_keeps_failing_is_requeued_max_restarts_times_then_fails(slurm_cluster, tmp_path):
    job, spec = slurm_cluster.submit(tmp_path, "fails", [sys.executable, "-c", "import sys; sys.exit(3)"],
                                     max_restarts=2)
    info = slurm_cluster.wait_done(job, timeout=170)
    text = log_text(spec.log_dir, "fails", job)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "2", text
    assert "restart 2 of 2" in text and "after 2 restarts (slurm.max_restarts): giving up" in text
