"""Launcher environments -> ranks (hibert/runtime/dist_env.py): Slurm layouts, torchrun/deepspeed, hostlists."""
import shutil
import subprocess

import pytest

from hibert.runtime.dist_env import (
    REQUEUE_EXIT_CODE,
    detect_dist_env,
    expand_hostlist,
    master_port_for_job,
    parse_hostlist,
    parse_tasks_per_node,
    resolve_host,
)
from slurm_helpers import controller_problem


def identity(host: str) -> str:
    return host


def slurm_task(procid: int, localid: int, nodeid: int, **extra: str) -> dict[str, str]:
    """The variables srun gives one task of a 4-node x 8-GPU step (job 123456)."""
    env = {
        "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid), "SLURM_NODEID": str(nodeid), "SLURM_NTASKS": "32",
        "SLURM_NNODES": "4", "SLURM_TASKS_PER_NODE": "8(x4)", "SLURM_NTASKS_PER_NODE": "8",
        "SLURM_JOB_NODELIST": "gpu-[001-004]",
    }
    env.update(extra)
    return env


@pytest.mark.parametrize("procid, localid, nodeid", [(0, 0, 0), (7, 7, 0), (8, 0, 1), (13, 5, 1), (31, 7, 3)])
def test_slurm_four_nodes_by_eight(procid, localid, nodeid):
    env = detect_dist_env(slurm_task(procid, localid, nodeid), resolve_master=identity)
    assert (env.rank, env.local_rank, env.node_rank) == (procid, localid, nodeid)
    assert (env.world_size, env.local_world_size, env.num_nodes) == (32, 8, 4)
    assert env.master_addr == "gpu-001"
    assert env.master_port == 10000 + 123456 % 50000 == master_port_for_job(123456)
    assert env.launcher == "slurm"
    assert env.is_main == (procid == 0) and env.is_distributed


@pytest.mark.parametrize("spec, nodeid, local_world", [("2(x2),1", 2, 1), ("2(x2),1", 1, 2), ("2,1", 0, 2),
                                                        ("2,1", 1, 1)])
def test_slurm_uneven_tasks_per_node(spec, nodeid, local_world):
    n = len(parse_tasks_per_node(spec))
    env = detect_dist_env({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                           "SLURM_NODEID": str(nodeid), "SLURM_NTASKS": str(sum(parse_tasks_per_node(spec))),
                           "SLURM_NNODES": str(n), "SLURM_TASKS_PER_NODE": spec,
                           "SLURM_JOB_NODELIST": f"n[1-{n}]"}, resolve_master=identity)
    assert env.local_world_size == local_world and env.num_nodes == n


def test_step_variables_win_over_the_allocation():
    # `srun -N1 -n1 -w n2` inside a 2-node job: the job-level nodelist still says n[1-2]
    env = detect_dist_env({"SLURM_STEP_ID": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                           "SLURM_NTASKS": "1", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n[1-2]",
                           "SLURM_NODELIST": "n[1-2]", "SLURM_STEP_NODELIST": "n2", "SLURM_STEP_NUM_TASKS": "1",
                           "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "1"},
                          resolve_master=identity)
    assert env.master_addr == "n2" and env.world_size == 1


def test_batch_shell_is_not_a_rank():
    # the sbatch script itself has SLURM_PROCID=0 and the job's task count, but no step id
    env = detect_dist_env({k: v for k, v in slurm_task(0, 0, 0).items() if k != "SLURM_STEP_ID"})
    assert env.launcher == "single" and env.world_size == 1


def test_overrides_master_addr_and_port():
    env = detect_dist_env(slurm_task(3, 3, 0, HIBERT_MASTER_ADDR="10.0.0.7", MASTER_PORT="23456"),
                          resolve_master=lambda h: pytest.fail("resolver must not run when overridden"))
    assert (env.master_addr, env.master_port) == ("10.0.0.7", 23456)


def test_torchrun_env_wins_over_slurm():
    env = detect_dist_env(slurm_task(13, 5, 1, RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2",
                                     GROUP_RANK="1", MASTER_ADDR="head", MASTER_PORT="29400"))
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.node_rank, env.num_nodes, env.master_addr, env.master_port) == (1, 2, "head", 29400)
    assert env.launcher == "torchrun"


def test_deepspeed_launcher_env():
    env = detect_dist_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_SIZE": "4",
                           "CROSS_RANK": "1", "CROSS_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "29500"})
    assert (env.rank, env.local_world_size, env.node_rank, env.num_nodes, env.launcher) == (5, 4, 1, 2, "deepspeed")


def test_single_process_and_export():
    env = detect_dist_env({})
    assert (env.rank, env.world_size, env.launcher) == (0, 1, "single")
    target: dict[str, str] = {}
    detect_dist_env(slurm_task(13, 5, 1), resolve_master=identity).export(target)
    assert target == {"RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "32", "LOCAL_WORLD_SIZE": "8",
                      "MASTER_ADDR": "gpu-001", "MASTER_PORT": str(master_port_for_job(123456))}
    assert detect_dist_env({**target, "SLURM_PROCID": "0"}).rank == 13  # exported values are read back


def test_requeue_exit_code_is_ex_tempfail():
    assert REQUEUE_EXIT_CODE == 75


HOSTLISTS = {
    "n[1-2]": ["n1", "n2"],
    "gpu-[001-004,007]": ["gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-007"],
    "a1,b[2-3]": ["a1", "b2", "b3"],
    "node7": ["node7"],
    "r[1-2]-n[01-02]": ["r1-n01", "r1-n02", "r2-n01", "r2-n02"],
    "x[8-11],y[09-10],z": ["x8", "x9", "x10", "x11", "y09", "y10", "z"],
}


@pytest.mark.parametrize("spec", sorted(HOSTLISTS))
def test_parse_hostlist(spec):
    assert parse_hostlist(spec) == HOSTLISTS[spec]


@pytest.mark.skipif(not shutil.which("scontrol"), reason="scontrol not installed (.ci/slurm_up.sh installs it)")
@pytest.mark.parametrize("spec", sorted(HOSTLISTS))
def test_parser_agrees_with_scontrol(spec):
    out = subprocess.run(["scontrol", "show", "hostnames", spec], capture_output=True, text=True, timeout=20)
    assert out.stdout.split() == parse_hostlist(spec) == expand_hostlist(spec)


@pytest.mark.parametrize("bad", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]"])
def test_parse_hostlist_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_hostlist(bad)


def test_parse_tasks_per_node():
    assert parse_tasks_per_node("8(x4)") == [8] * 4
    assert parse_tasks_per_node("2(x2),1") == [2, 2, 1]
    with pytest.raises(ValueError):
        parse_tasks_per_node("8x4")


def test_resolve_host_keeps_resolvable_names():
    assert resolve_host("localhost") == "localhost"


@pytest.mark.slurm
@pytest.mark.timeout(30)
def test_resolve_unresolvable_slurm_node_to_nodeaddr():
    problem = controller_problem()
    if problem:
        pytest.skip(problem)
    # n1 of the local cluster is not a DNS name; its NodeAddr is 127.0.0.1 (.ci/slurm_up.sh)
    assert resolve_host("n1") == "127.0.0.1"
    assert resolve_host("no-such-node-xyz") == "no-such-node-xyz"
