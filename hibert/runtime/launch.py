"""`--nproc N`: start N local ranks of the same command (CPU gloo or one GPU each).

A thin launcher rather than torchrun so that (a) SIGUSR1/SIGTERM reach every rank (preemption) and
(b) the requeue exit code survives. Clusters use srun/torchrun/deepspeed; hibert.runtime.dist_env maps them all.
The launching process imports no torch (nor the heads, nor MLflow): the ranks start ~1.5 s sooner.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hibert.config import Config, save_resolved
from hibert.errors import UserError
from hibert.redact import redact_uri
from hibert.registry import check_model_ref, check_reachable, client, sqlite_path, tracking_uri
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


def _die_with_launcher() -> Callable[[], None] | None:
    """For a rank: SIGKILL when the launcher dies, even by SIGKILL (Linux PR_SET_PDEATHSIG): ranks left without
    it would train on, export and register a job its user killed. It is a kill -9 of the job, which the next run
    resumes from the newest complete checkpoint. libc is loaded here: the child only calls it (fork to exec)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    launcher = os.getpid()

    def arm() -> None:
        libc.prctl(1, signal.SIGKILL)   # 1: PR_SET_PDEATHSIG
        if os.getppid() != launcher:    # the launcher died before the line above
            os._exit(1)

    return arm


def launch_local(nproc: int, argv: list[str]) -> int:
    port = str(free_port())
    procs: list[subprocess.Popen] = []
    tied = _die_with_launcher()
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        # the launcher runs no threads: preexec_fn is safe here
        procs.append(subprocess.Popen([sys.executable, *argv], env=env, preexec_fn=tied))  # noqa: PLW1509

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


def check_init_reference(ref: str | None, uri: str) -> None:
    """`run.init` names a directory or a registered version in `uri`, or one `UserError` line naming it and the
    store. Checked by the launcher, before any rank starts and before anything is created: otherwise rank 0 fails
    on it while its peers wait for its broadcast. Looks only (resolve_model downloads, rank 0 does that)."""
    if not ref:
        return
    if not ref.startswith("models:/"):
        if not Path(ref).is_dir():
            raise UserError(f"run.init={ref}: neither a models:/ reference nor a directory")
        return
    parsed = check_model_ref(ref, example="models:/hibert-encoder@in-domain")
    db = sqlite_path(uri)
    if db is not None and not db.is_file():  # not created by looking
        raise UserError(f"model reference {ref!r}: there is no registry at {db} (nothing was trained there); "
                        "name the store (tracking.uri=..., run.output_dir=...) or pass an export directory")
    from mlflow.exceptions import MlflowException  # lazy: ~1 s, paid only for a models:/ run.init

    name, alias, version = parsed
    try:
        c = client(uri)
        c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, version)
    except MlflowException as e:
        reason = redact_uri(str(e.message).splitlines()[0])[:300]
        raise UserError(f"model reference {ref!r} does not resolve in {redact_uri(uri)}: {reason} "
                        "(hibert registry list shows what is there)") from None


def relaunch(cfg: Config, command: str, nproc: int) -> int:
    """Re-run this command on `nproc` local ranks with the resolved config as the recipe."""
    try:  # before any rank starts
        uri = tracking_uri(cfg.tracking.uri, cfg.run.output_dir, create=False)
        check_reachable(uri)
        check_init_reference(cfg.run.init, uri)
    except UserError as e:
        print(f"hibert {command}: {e}", file=sys.stderr)
        return 1
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_launch_dirs(cfg.run_dir)
    # the resolved config the ranks start from (0600: it may hold credentials), gone when they are
    launch_dir = Path(tempfile.mkdtemp(prefix=f"launch-{os.getpid()}-", dir=cfg.run_dir))
    try:
        path = save_resolved(cfg, launch_dir)
        return launch_local(nproc, ["-m", "hibert.cli", command, str(path)])
    finally:
        shutil.rmtree(launch_dir, ignore_errors=True)


def remove_stale_launch_dirs(run_dir: Path) -> list[Path]:
    """`launch-<pid>-*` folders a killed launcher left (its finally never ran): those of a process that is
    gone, and those named before the pid was in the name; a live launcher's stays."""
    removed = []
    for d in run_dir.glob("launch-*"):
        parts = d.name.split("-")
        pid = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None
        if pid is not None and _alive(pid):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
