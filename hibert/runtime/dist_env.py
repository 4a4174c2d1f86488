"""The one place that maps a launcher's environment to distributed ranks.

Three launchers are understood, in this order:

1. torchrun / the deepspeed launcher: they set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
   per process, so those win whenever present;
2. Slurm: one `srun` task per GPU. Slurm sets SLURM_PROCID/SLURM_LOCALID/SLURM_NODEID and the step's
   task layout, but not the torch variables (nor does `deepspeed --launcher slurm`), so they are
   derived here; the master is the first host of the step's nodelist and the port a function of the
   job id, so every task computes the same rendezvous without talking to the others;
3. otherwise a single process.

`detect_dist_env().export()` then makes `torch.distributed.init_process_group(init_method="env://")`
and `deepspeed.init_distributed()` work unchanged.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import asdict, dataclass
from itertools import product
from typing import Literal

# Exit status meaning "stopped early on purpose (preemption/time limit), checkpoint written, run me
# again": EX_TEMPFAIL from sysexits.h. The sbatch scripts requeue the job when a step exits with it.
REQUEUE_EXIT_CODE = 75
# "Trained and exported, but the tracking server was away: metrics and/or the registration wait in the run's
# outbox" (EX_UNAVAILABLE). A requeued job, or `hibert registry sync <run dir>`, sends them.
TRACKING_PENDING_EXIT_CODE = 69

DEFAULT_MASTER_PORT = 29500
Launcher = Literal["torchrun", "deepspeed", "slurm", "single"]


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    launcher: Launcher

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def export(self, environ: MutableMapping[str, str] | None = None) -> DistEnv:
        """Write the torch.distributed `env://` variables (default: into os.environ); returns self."""
        env = os.environ if environ is None else environ
        env.update({
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        })
        return self

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def detect_dist_env(environ: Mapping[str, str] | None = None,
                    resolve_master: Callable[[str], str] | None = None) -> DistEnv:
    """Read the launcher's variables from `environ` (default os.environ).

    `resolve_master` maps the Slurm master host name to an address (default `resolve_host`).
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return _from_torch_env(env)
    # The batch shell of an sbatch job also has SLURM_PROCID=0 and the job's SLURM_NTASKS, but it is
    # not a task of a step: treating it as rank 0 of N would wait forever for the other ranks.
    if "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        return _from_slurm_env(env, resolve_master or resolve_host)
    return DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1,
                   master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                   master_port=int(env.get("MASTER_PORT", DEFAULT_MASTER_PORT)), launcher="single")


def _from_torch_env(env: Mapping[str, str]) -> DistEnv:
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", 0))
    # torchrun: LOCAL_WORLD_SIZE, GROUP_RANK; deepspeed's launcher: LOCAL_SIZE, CROSS_RANK, CROSS_SIZE
    local_world = int(env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or world)
    node_rank = int(env.get("GROUP_RANK") or env.get("CROSS_RANK") or rank // local_world)
    num_nodes = int(env.get("GROUP_WORLD_SIZE") or env.get("CROSS_SIZE") or -(-world // local_world))
    launcher: Launcher = "deepspeed" if ("CROSS_RANK" in env or "LOCAL_SIZE" in env) else "torchrun"
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
                   node_rank=node_rank, num_nodes=num_nodes,
                   master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                   master_port=int(env.get("MASTER_PORT", DEFAULT_MASTER_PORT)), launcher=launcher)


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for n in names:
        if env.get(n):
            return env[n]
    return None


def _from_slurm_env(env: Mapping[str, str], resolve_master: Callable[[str], str]) -> DistEnv:
    # Step-level variables first: a step may use a subset of the allocation (`srun -N1 -w n2`), and
    # then SLURM_JOB_NODELIST still names every node of the job.
    rank = int(env["SLURM_PROCID"])
    local_rank = int(env.get("SLURM_LOCALID", 0))
    node_rank = int(env.get("SLURM_NODEID", 0))
    world = int(_first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS") or 1)
    num_nodes = int(_first(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") or 1)
    per_node = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
    counts = parse_tasks_per_node(per_node) if per_node else []
    if len(counts) == num_nodes:
        local_world = counts[node_rank]
    elif len(counts) == 1:   # SLURM_NTASKS_PER_NODE is a single number
        local_world = counts[0]
    else:
        local_world = max(1, world // num_nodes)
    if env.get("HIBERT_MASTER_ADDR"):
        master = env["HIBERT_MASTER_ADDR"]
    else:
        nodelist = _first(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        hosts = expand_hostlist(nodelist) if nodelist else []
        master = resolve_master(hosts[0]) if hosts else "127.0.0.1"
    if env.get("MASTER_PORT"):
        port = int(env["MASTER_PORT"])
    elif env.get("SLURM_JOB_ID"):
        port = master_port_for_job(int(env["SLURM_JOB_ID"]))
    else:
        port = DEFAULT_MASTER_PORT
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
                   node_rank=node_rank, num_nodes=num_nodes, master_addr=master, master_port=port,
                   launcher="slurm")


def master_port_for_job(job_id: int) -> int:
    """Deterministic rendezvous port in [10000, 60000): every task of the job computes the same one,
    and concurrent jobs sharing a node get different ones. The sbatch scripts use the same formula."""
    return 10000 + job_id % 50000


_TASKS_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed tasks-per-node list: "8(x4)" -> [8, 8, 8, 8]; "2(x2),1" -> [2, 2, 1]."""
    out: list[int] = []
    for part in spec.split(","):
        m = _TASKS_RE.match(part.strip())
        if not m:
            raise ValueError(f"bad tasks-per-node spec {spec!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def _split_top_level(s: str) -> list[str]:
    """Split on commas outside brackets: "a1,b[2-3]" -> ["a1", "b[2-3]"]."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in hostlist {s!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced brackets in hostlist {s!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_range(body: str) -> list[str]:
    """Inside one bracket: "001-004,007" -> ["001", ..., "004", "007"]; zero padding is kept."""
    out: list[str] = []
    for item in body.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad hostlist range [{body}]")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"descending hostlist range [{body}]")
        width = len(lo)
        out += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    return out


def parse_hostlist(spec: str) -> list[str]:
    """Pure-Python Slurm hostlist expansion: "n[1-2]", "gpu-[001-004,007]", "a1,b[2-3]",
    "r[1-2]-n[01-02]" (several brackets give the product, in Slurm's order)."""
    hosts: list[str] = []
    for item in _split_top_level(spec):
        pieces = re.split(r"\[([^\]]*)\]", item)  # literal, range, literal, range, ..., literal
        choices = [[p] if i % 2 == 0 else _expand_range(p) for i, p in enumerate(pieces)]
        hosts += ["".join(combo) for combo in product(*choices)]
    return hosts


def expand_hostlist(spec: str) -> list[str]:
    """`scontrol show hostnames` when scontrol is installed (it is the reference), else parse_hostlist."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", spec], capture_output=True, text=True,
                                 timeout=20)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return parse_hostlist(spec)


def resolve_host(name: str) -> str:
    """A name every node can connect to: the name itself when it resolves, else the node's NodeAddr
    from `scontrol show node` (clusters whose node names are not DNS names), else the name."""
    try:
        socket.gethostbyname(name)
        return name
    except OSError:
        pass
    addr = slurm_node_addr(name)
    return addr or name


def slurm_node_addr(node: str) -> str | None:
    """NodeAddr of a Slurm node, or None when scontrol is missing or does not know the node."""
    if not shutil.which("scontrol"):
        return None
    try:
        out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\bNodeAddr=(\S+)", out.stdout) if out.returncode == 0 else None
    return m.group(1) if m else None
