"""One writer per run directory. Two runs with the same `<output_dir>/<run.name>` would interleave their
checkpoints, exports and step logs; the second one refuses instead, naming the first (host, pid, start time).

The lock is an flock on `<run dir>/.writer.lock` held by rank 0 for the life of the process (filelock): the
kernel drops it when that process ends, however it ends (kill -9 and a node's crash included, for a lock on a
local or NFSv4 filesystem), so a stale lock frees itself and a requeued or resumed job takes it again.
`.writer.json` next to it names the holder. Every rank learns the outcome and the holder (one broadcast), so the refusal is
one line on every rank, not a hang in the next collective."""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from filelock import FileLock, Timeout

from hibert.errors import UserError

log = logging.getLogger("hibert.run")
LOCK, HOLDER = ".writer.lock", ".writer.json"


def try_claim(run_dir: Path) -> tuple[FileLock | None, str | None]:
    """(the held lock, None), or (None, who holds it) when another live process does."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(run_dir / LOCK))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            who = json.loads((run_dir / HOLDER).read_text())
            holder = f"pid {who['pid']} on {who['host']} (since {who['since']})"
        except (OSError, ValueError, KeyError):
            holder = "another process"
        return None, holder
    except OSError as e:  # a filesystem without locks (some parallel filesystems): say so, go on
        log.warning("run directory %s: cannot lock it (%s); make sure no other run writes there", run_dir, e)
        return None, None
    (run_dir / HOLDER).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                              "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
    return lock, None


def claim_run_dir(run_dir: Path, is_main: bool, device: torch.device | str = "cpu") -> FileLock | None:
    """Rank 0 claims `run_dir`; every rank raises the same UserError if another run holds it."""
    lock, holder = try_claim(run_dir) if is_main else (None, None)
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [holder]
        dist.broadcast_object_list(box, src=0, device=torch.device(device))  # every rank names the holder
        holder = box[0]
    if holder:
        raise UserError(f"hibert: run directory {run_dir} is in use by {holder}: wait for it to end, or give this "
                        "run another run.name / run.output_dir")
    return lock
