"""Jobs on a real Slurm cluster (two nodes, .ci/slurm_up.sh) through the project's sbatch template:
rank mapping across nodes with a gloo all-reduce, and the preemption path (USR1 -> checkpoint ->
exit 75 -> requeue -> resume). The stand-in programs take the place of `hibert pretrain`."""
import json
import textwrap

import pytest

from hibert.runtime.dist_env import REQUEUE_EXIT_CODE, master_port_for_job
from slurm_helpers import log_text, python_command, slurm_cluster  # noqa: F401  (fixture)

pytestmark = pytest.mark.slurm

ALLREDUCE = textwrap.dedent("""
    import json, os, sys
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from hibert.runtime.dist_env import detect_dist_env

    env = detect_dist_env().export()
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=40))
    t = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(t)
    record = {**env.as_dict(), "sum": t.item(), "dist_rank": dist.get_rank(),
              "dist_world": dist.get_world_size(), "slurm_nodeid": int(os.environ["SLURM_NODEID"]),
              "slurmd_node": os.environ["SLURMD_NODENAME"]}
    with open(os.path.join(sys.argv[1], f"rank{env.rank}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()
""")

# Counts to a target; on SIGUSR1 saves the count and exits with REQUEUE_EXIT_CODE; resumes from the
# saved count when started again. One state file per rank.
COUNTER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from hibert.runtime.dist_env import REQUEUE_EXIT_CODE, detect_dist_env

    out, target = Path(sys.argv[1]), int(sys.argv[2])
    env = detect_dist_env()
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    stop = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
    state = out / f"count-rank{env.rank}"
    count = int(state.read_text()) if state.exists() else 0
    print(f"rank {env.rank} restart {restart}: resuming at {count}", flush=True)
    (out / f"ready-rank{env.rank}-restart{restart}").touch()

    def save():
        tmp = state.with_suffix(".tmp")
        tmp.write_text(str(count))
        tmp.replace(state)

    while count < target:
        if stop:
            save()
            print(f"rank {env.rank}: SIGUSR1, checkpointed at {count}", flush=True)
            if env.rank == 0:  # like the trainer closing its MLflow run after the others left
                time.sleep(1.5)
                print("rank 0: closed after checkpoint", flush=True)
            sys.exit(REQUEUE_EXIT_CODE)
        count += 1
        time.sleep(0.05)
    save()
    print(f"rank {env.rank}: reached {count}", flush=True)
""")


@pytest.mark.timeout(90)
def test_two_node_ranks_and_allreduce(slurm_cluster, tmp_path):
    prog = tmp_path / "allreduce.py"
    prog.write_text(ALLREDUCE)
    out = tmp_path / "out"
    out.mkdir()
    job, spec = slurm_cluster.submit(tmp_path, "ranks", python_command(prog, str(out)), nodes=2)
    info = slurm_cluster.wait_done(job, timeout=60)
    log = log_text(spec.log_dir, "ranks", job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    records = {r["rank"]: r for r in (json.loads(p.read_text()) for p in out.glob("rank*.json"))}
    assert sorted(records) == [0, 1], log
    for rank, r in records.items():
        assert r["launcher"] == "slurm"
        assert (r["world_size"], r["dist_world"], r["dist_rank"]) == (2, 2, rank)
        assert (r["num_nodes"], r["node_rank"], r["slurm_nodeid"]) == (2, rank, rank)
        assert (r["local_rank"], r["local_world_size"]) == (0, 1)
        assert r["sum"] == 3.0                        # 1 + 2: both ranks took part
        # n1 does not resolve as a host name: the address comes from scontrol's NodeAddr
        assert r["master_addr"] == "127.0.0.1"
        assert r["master_port"] == master_port_for_job(int(job))
    assert {records[0]["slurmd_node"], records[1]["slurmd_node"]} == {"n1", "n2"}
    assert "step exited with status 0" in log


@pytest.mark.timeout(120)
def test_usr1_checkpoint_requeue_resume(slurm_cluster, tmp_path):
    prog = tmp_path / "counter.py"
    prog.write_text(COUNTER)
    out = tmp_path / "out"
    out.mkdir()
    target = 200  # 10 s of counting: the signal lands well before the end
    job, spec = slurm_cluster.submit(tmp_path, "preempt", python_command(prog, str(out), str(target)), nodes=2)
    slurm_cluster.wait_until(
        "both ranks to install their USR1 handler",
        lambda: all((out / f"ready-rank{r}-restart0").exists() for r in (0, 1)), timeout=40)
    # What Slurm does at --signal=B:USR1@grace before the time limit: signal the batch shell only.
    slurm_cluster.signal(job, "USR1", "--batch")
    info = slurm_cluster.wait_done(job, timeout=75)
    log = log_text(spec.log_dir, "preempt", job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log
    assert "batch script got SIGUSR1, forwarding it to srun" in log
    assert f"step exited with status {REQUEUE_EXIT_CODE}" in log
    assert f"requeueing job {job}" in log
    assert "restart 1 on n[1-2]" in log                # the requeued run appended to the same log
    assert "rank 0: closed after checkpoint" in log    # rank 1 leaving first did not kill rank 0
    for rank in (0, 1):
        saved = int(log.split(f"rank {rank}: SIGUSR1, checkpointed at ")[1].split()[0])
        assert 0 < saved < target                      # interrupted part-way, on both nodes
        assert f"rank {rank} restart 1: resuming at {saved}" in log
        assert f"rank {rank}: reached {target}" in log
        assert (out / f"count-rank{rank}").read_text() == str(target)


@pytest.mark.timeout(90)
def test_time_limit_signal_reaches_the_tasks_and_requeues(slurm_cluster, tmp_path):
    # --time=1 with --signal=B:USR1@55: Slurm itself sends USR1 to the batch shell once fewer than 55 s
    # are left (it checks time limits about every 30 s), exactly as before a real limit.
    prog = tmp_path / "counter.py"
    prog.write_text(COUNTER)
    out = tmp_path / "out"
    out.mkdir()
    job, spec = slurm_cluster.submit(tmp_path, "limit", python_command(prog, str(out), "100000"), nodes=2,
                                     time="00:01:00", signal_grace_s=55)

    def requeued() -> bool:
        return f"requeueing job {job}" in log_text(spec.log_dir, "limit", job)

    slurm_cluster.wait_until("the time-limit signal and the requeue", requeued, timeout=70)
    log = log_text(spec.log_dir, "limit", job)
    assert "batch script got SIGUSR1, forwarding it to srun" in log
    assert all(f"rank {r}: SIGUSR1, checkpointed at" in log for r in (0, 1)), log
    assert f"step exited with status {REQUEUE_EXIT_CODE}" in log
    slurm_cluster.wait_until("the job to be back in the queue",
                             lambda: slurm_cluster.show(job).get("Restarts") == "1", timeout=10)
