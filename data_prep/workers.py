"""Worker processes: each builds its segmenter (and, once the tokenizer exists, its shard processor) once
and then serves segmentation batches (tokenizer sample) and whole shards."""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Iterator

from hibert.config.data import DataConfig
from hibert.data_prep.process import Sentencizer, ShardProcessor
from hibert.data_prep.segment import direct_fast_path, preload_modules

_state: dict[str, Any] = {}


def _init(cfg_json: str, out: str, plan: dict[str, Any], q: Any) -> None:
    cfg = DataConfig.model_validate_json(cfg_json)
    _state.update(cfg=cfg, out=Path(out), plan=plan, queue=q, sentencizer=Sentencizer(cfg), processor=None)


def _segment(items: list[tuple[list[str], bool]]) -> list[list[tuple[str, int]]]:
    return _state["sentencizer"].sentences(items)


def _shard(shard: int) -> dict[str, Any]:
    if _state["processor"] is None:
        _state["processor"] = ShardProcessor(_state["cfg"], _state["out"], _state["plan"], _state["sentencizer"])
    q = _state["queue"]
    return _state["processor"].run(shard, (lambda d, w: q.put((d, w))) if q is not None else None)


def start_method(cfg: DataConfig) -> str:
    """How to start the workers. `fork` when no other Python thread runs (`hibert prep` when its pool starts)
    and the segmenter does not load torch: the workers inherit the parent's imports and load spaCy side by
    side (2 workers on Reuters: median wall 10.2 s against 11.7 s with a fork server, which re-imports
    everything, serially, before the first worker exists). `forkserver` otherwise: forking while another thread holds a
    lock (logging, I/O) can leave the child stuck on it, and torch in a child forked from a process whose
    OpenMP pool ran can hang; a parent that has loaded torch may run such native threads, which
    `threading.active_count` does not see. (numpy's OpenBLAS threads are fork-safe: it re-creates its pool in
    the child.) The workers all start before any thread of the caller's, and a dead worker is not replaced."""
    if threading.active_count() == 1 and "torch" not in sys.modules and direct_fast_path(cfg.segmenter):
        return "fork"
    return "forkserver"


class WorkerDied(RuntimeError):
    """A worker process ended without returning (killed, out of memory, or its start-up failed)."""


def _ready() -> int:
    return os.getpid()


class WorkerPool:
    """A process pool whose workers each hold a segmenter and shard processor for all the work they get.
    A `concurrent.futures` pool: a worker that dies (OOM killer, a signal) fails the run at once with
    WorkerDied, where a `multiprocessing.Pool` would replace it and wait forever for the lost task."""

    def __init__(self, cfg: DataConfig, out: Path, plan: dict[str, Any], workers: int, progress: bool,
                 method: str | None = None):
        self.method = method or start_method(cfg)
        ctx = mp.get_context(self.method)
        if self.method == "forkserver":
            # the fork server imports the heavy modules once; each worker forks from it already warm
            ctx.set_forkserver_preload(["hibert.data_prep.workers", "hibert.data_prep.segment", "sentencepiece",
                                        *preload_modules(cfg.segmenter)])
        self.queue = ctx.Queue() if progress else None
        self.pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                                        initargs=(cfg.model_dump_json(), str(out), plan, self.queue))
        # start the workers now, before the caller starts any thread (with fork, all of them start here)
        self._all(_ready, [()], "starting")

    def _all(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]], doing: str) -> list[Any]:
        try:
            return [f.result() for f in [self._submit(fn, *a) for a in calls]]
        except BrokenProcessPool as e:
            raise WorkerDied(f"a prep worker process died while {doing} (killed, or out of memory?)") from e

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        try:
            return self.pool.submit(fn, *args)
        except OSError as e:
            # a worker died and the pool's management thread is tearing the queues down while submit() starts
            # a replacement: the same broken pool, seen a moment earlier
            raise BrokenProcessPool(f"a worker died while submitting ({e})") from e

    def segment(self, batches: list[list[tuple[list[str], bool]]]) -> list[list[list[tuple[str, int]]]]:
        return self._all(_segment, [(b,) for b in batches], "segmenting the tokenizer sample")

    def shards(self, shards: list[int]) -> Iterator[dict[str, Any]]:
        """Results as shards finish."""
        futures: dict[Future, int] = {}
        try:
            for s in shards:
                futures[self._submit(_shard, s)] = s
            for f in as_completed(futures):
                yield f.result()
        except BrokenProcessPool as e:
            done = {s for f, s in futures.items() if f.done() and not f.cancelled() and f.exception() is None}
            left = [s for s in shards if s not in done]
            raise WorkerDied(f"a prep worker process died (killed, or out of memory?) with shards {left} "
                             "unfinished; finished shards are kept: rerun the same command to resume") from e

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def terminate(self) -> None:
        procs = list((self.pool._processes or {}).values())  # no public handle before Python 3.14
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(10)
