"""Preemption: SIGUSR1/SIGTERM set a flag; ranks agree on it at the next step boundary (all-reduce MAX),
then everyone checkpoints and exits with REQUEUE_EXIT_CODE so the Slurm script requeues the job."""
from __future__ import annotations

import ctypes
import os
import signal

import torch
import torch.distributed as dist

from hibert.runtime.collectives import reduce_device


class PreemptionFlag:
    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self) -> None:
        self.signal_name: str | None = None

    def install(self) -> "PreemptionFlag":
        for s in self.SIGNALS:
            signal.signal(s, self._handler)
        return self

    def _handler(self, signum, _frame) -> None:
        self.signal_name = signal.Signals(signum).name

    def agreed(self, group: dist.ProcessGroup | None = None) -> bool:
        """Collective: True on every rank if any rank was signalled. Asked at every step boundary, so it must
        not wait for the device: the flag is reduced on the host, over `group` (a gloo group beside NCCL; None:
        the default group, gloo on CPU), and a single process asks no one."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return self.signal_name is not None
        # without a host-side group, NCCL reduces device tensors only (a sync, but the flag still agreed)
        t = torch.tensor([1 if self.signal_name else 0], dtype=torch.int32, device=reduce_device(group))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return bool(t.item())


_FLAG: PreemptionFlag | None = None


def preemption_flag() -> PreemptionFlag:
    """The process's flag, installed on first use. `prepare_run` asks for it before the slow start-up (imports,
    DeepSpeed, data, the model): a SIGUSR1 from Slurm or the launcher then waits for the first step boundary
    (checkpoint, exit for requeue) instead of killing a rank that had not installed its handler yet."""
    global _FLAG
    if _FLAG is None:
        _FLAG = PreemptionFlag().install()
    return _FLAG


def ignore_preemption_signals(_worker_id: int = 0, parent: int | None = None) -> None:
    """DataLoader worker_init_fn: only the trainer reacts to preemption; workers must keep feeding it
    while it finishes the step and checkpoints. Since they ignore SIGTERM, they are tied to their parent's
    life instead (Linux PR_SET_PDEATHSIG), so no worker outlives a crashed trainer.

    A worker forked just before its trainer was killed would miss both the death signal (set after the
    parent was gone) and torch's own watchdog (which then watches init): it would live on holding the
    trainer's inherited gloo sockets open, and the other ranks would wait on them for
    run.collective_timeout_s instead of failing at once. `parent` (the trainer's pid, taken before the
    fork) closes that window."""
    for s in PreemptionFlag.SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    try:

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if parent is not None and os.getppid() != parent:
        os._exit(1)
