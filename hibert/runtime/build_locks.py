"""DeepSpeed's just-in-time C++ ops and the lock that guards their build.

DeepSpeed builds an op the first time it is used, into torch's user-wide extensions cache
(`$TORCH_EXTENSIONS_DIR`, else `~/.cache/torch_extensions/<python>_<accelerator>/<op>/`), and torch guards the
build with a `lock` file that the builder removes when it is done. A process killed during the build (kill -9,
a preemption at start-up, a time box) leaves the file behind, and every later build of that op, by every job
of every node that shares $HOME, waits on it forever without a word (torch's `FileBaton.wait`).

Two guards here:
- `skip_unneeded_ops()`: the CPU backend's shared-memory all-reduce (`deepspeed_shm_comm`), built in
  `deepspeed.init_distributed` on every CPU run, serves only DeepSpeed's inference all-reduce; training never
  calls it, so it is never built.
- `wait_for_build_lock(op)` before an op that is built (DeepSpeed's CPU Adam under optimizer offload): a lock
  younger than `STALE_AFTER_S` is a build in progress and is waited for; one older, or one that outlives the
  wait, is stale, and start-up stops with one line naming the file to remove.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from hibert.errors import UserError

# an op's build takes a minute or two; a lock this old has no builder behind it
STALE_AFTER_S = 600.0
UNNEEDED_OPS = ("deepspeed_shm_comm",)


def extensions_root() -> Path:
    """The folder torch builds extensions in (torch.utils.cpp_extension._get_build_directory's root)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env)
    from torch.utils.cpp_extension import get_default_build_root   # lazy: only where an op may be built

    if torch.version.hip is not None:
        accel = f"rocm{torch.version.hip.replace('.', '')}"
    elif torch.version.cuda is not None:
        accel = f"cu{torch.version.cuda.replace('.', '')}"
    else:
        accel = "cpu"
    return Path(get_default_build_root()) / f"py{sys.version_info.major}{sys.version_info.minor}{sys.abiflags}_{accel}"


def skip_unneeded_ops() -> None:
    """Mark the ops training never calls as unavailable, so DeepSpeed does not build them (call after
    `import deepspeed`, before `deepspeed.init_distributed`)."""
    import deepspeed.ops   # lazy: the caller has imported deepspeed already

    for name in UNNEEDED_OPS:
        deepspeed.ops.__compatible_ops__[name] = False


def wait_for_build_lock(op: str, *, stale_after_s: float = STALE_AFTER_S, poll_s: float = 1.0,
                        clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once `op` has no build lock; a stale lock (older than `stale_after_s`, or still there when it
    turns that old) is a UserError naming the file."""
    lock = extensions_root() / op / "lock"
    while True:
        try:
            age = clock() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age >= stale_after_s:
            raise UserError(
                f"{lock}: a build lock {age / 60:.0f} min old with no build behind it (a process killed while "
                f"DeepSpeed built its {op} op); remove it (rm {lock}) and start again")
        sleep(min(poll_s, stale_after_s - age))
