"""The real `hibert pretrain` (DeepSpeed ZeRO-2 over gloo, one rank per node) on the local two-node
cluster through the project's sbatch template: ranks from SLURM_*, USR1 mid-run, checkpoint, exit 75,
requeue, resume from that checkpoint, finish and register the encoder."""
import re
import sys

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
