"""The real `hibert pretrain` (DeepSpeed ZeRO-2 over gloo, one rank per node) on the local two-node
cluster through the project's sbatch template: the short soak — kills (-9) of a rank and USR1 mixed (USR1:
checkpoint, exit 75, requeue, resume from that checkpoint), the job requeuing itself (slurm.max_restarts),
ending bit-identical to an uninterrupted run; and a step that keeps failing. Registering from a Slurm job:
test_slurm_chain.py."""
import re
import sys
from pathlib import Path

import pytest

from hibert.runtime.dist_env import REQUEUE_EXIT_CODE
from slurm_helpers import log_text, slurm_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.mark.timeout(480)
def test_soak_three_interruptions_end_bit_identical(slurm_cluster, tiny_data, tmp_path):
    """The soak (benchmarks/soak_slurm.py) cut to 3 interruptions: kill -9 of a rank while a checkpoint is
    being written, SIGUSR1, kill -9 — the job requeues itself each time (the kills through
    slurm.max_restarts), resumes from the newest complete checkpoint and ends with the weights of the same
    job run without interruption. The USR1 (preemption) leg says what it did at every hop: checkpoint at
    step N, exit 75, requeue, resume from step N."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from soak_slurm import soak

    result = soak(tiny_data["open"], tmp_path, interruptions=3, steps=40, seed=1,
                  kinds=["kill9-during-save", "usr1", "kill9"], say=lambda _: None)
    assert result["state"] == "COMPLETED" and result["restarts"] == 3, result
    assert result["identical"], result
    assert result["lost_rank_named"] == 2, result      # srun: "task N: Killed", once per kill
    assert len(result["resumed_at"]) >= 2, result      # USR1 always leaves a checkpoint to resume from
    assert result["kills_during_save"] == 1, result
    text = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "soak" / "logs").glob("soak-*.*"))
    saved = int(re.search(r"preempted by SIGUSR1: checkpoint at step (\d+)", text).group(1))
    assert f"step exited with status {REQUEUE_EXIT_CODE}" in text and "requeueing job" in text, text[-3000:]
    assert re.search(rf"resumed from \S+step_0*{saved} at step {saved}\b", text), text[-3000:]
    assert "pretrain finished at step 40" in text, text[-3000:]


@pytest.mark.timeout(200)
def test_a_step_that_keeps_failing_is_requeued_max_restarts_times_then_fails(slurm_cluster, tmp_path):
    job, spec = slurm_cluster.submit(tmp_path, "fails", [sys.executable, "-c", "import sys; sys.exit(3)"],
                                     max_restarts=2)
    info = slurm_cluster.wait_done(job, timeout=170)
    text = log_text(spec.log_dir, "fails", job)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "2", text
    assert "restart 2 of 2" in text and "after 2 restarts (slurm.max_restarts): giving up" in text
