"""`--nproc N`: start N local ranks of the same command (CPU gloo or one GPU each).

A thin launcher rather than torchrun so that (a) SIGUSR1/SIGTERM reach every rank (preemption) and
(b) the requeue exit code survives. Clusters use srun/torchrun/deepspeed; hibert.runtime.dist_env maps them all.
The launching process imports no torch (nor the heads, nor MLflow): the ranks start ~1.5 s sooner.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hibert.config import Config, save_resolved
from hibert.errors import UserError
from hibert.registry import check_reachable, tracking_uri
from hibert.runtime.dist_env import REQUEUE_EXIT_CODE, TRACKING_PENDING_EXIT_CODE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# exits that are not a rank's failure (the others are not stopped): done, preempted, tracking left pending
OK = (0, REQUEUE_EXIT_CODE, TRACKING_PENDING_EXIT_CODE)


def _how(code: int) -> str:
    if code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal has no name
        return f"killed by signal {-code}"


def launch_local(nproc: int, argv: list[str]) -> int:
    port = str(free_port())
    procs: list[subprocess.Popen] = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        procs.append(subprocess.Popen([sys.executable, *argv], env=env))

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        codes: dict[int, int] = {}
        failed_at: float | None = None
        cause = -1  # the rank named first when the job fails: its exit code is the job's
        while len(codes) < nproc:
            ended = [i for i, p in enumerate(procs) if i not in codes and p.poll() is not None]
            codes.update((i, procs[i].returncode) for i in ended)
            # a rank killed by a signal first: its peers then fail in their collective, often within the same poll
            failed = sorted((i for i in ended if codes[i] not in OK), key=lambda i: (codes[i] >= 0, i))
            if failed and failed_at is None:
                failed_at = time.time()  # one rank died: the others would wait in a collective
                cause = failed[0]
                print("hibert: " + "; ".join(f"rank {i} (pid {procs[i].pid}) ended ({_how(codes[i])})" for i in failed)
                      + "; stopping the other ranks", file=sys.stderr, flush=True)
                for q in procs:
                    if q.poll() is None:
                        q.terminate()
            if failed_at is not None and time.time() - failed_at > 20:
                for q in procs:
                    if q.poll() is None:
                        q.kill()
            time.sleep(0.2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if cause >= 0:
        return codes[cause] if codes[cause] > 0 else 1
    return next((c for c in (REQUEUE_EXIT_CODE, TRACKING_PENDING_EXIT_CODE) if c in codes.values()), 0)


def relaunch(cfg: Config, command: str, nproc: int) -> int:
    """Re-run this command on `nproc` local ranks with the resolved config as the recipe."""
    try:  # before any rank starts
        check_reachable(tracking_uri(cfg.tracking.uri, cfg.run.output_dir, create=False))
    except UserError as e:
        print(f"hibert {command}: {e}", file=sys.stderr)
        return 1
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    path = save_resolved(cfg, Path(tempfile.mkdtemp(prefix="launch-", dir=cfg.run_dir)))
    return launch_local(nproc, ["-m", "hibert.cli", command, str(path)])
