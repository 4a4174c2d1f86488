"""Worker processes: each builds its segmenter (and, once the tokenizer exists, its shard processor) once
and then serves segmentation batches (tokenizer sample) and whole shards."""
from __future__ import annotations

import multiprocessing as mp
import sys
import threading
from pathlib import Path
from typing import Any

from hibert.config.data import DataConfig

from data_prep.process import Sentencizer, ShardProcessor
from data_prep.segment import direct_fast_path, preload_modules

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
    the child.) With fork, a worker that dies is replaced by a fork from the parent while the pool's and the
    progress bar's threads run: the pool hangs after a worker crash either way, and that is the case where
    it happens."""
    if threading.active_count() == 1 and "torch" not in sys.modules and direct_fast_path(cfg.segmenter):
        return "fork"
    return "forkserver"


class WorkerPool:
    """A process pool whose workers each hold a segmenter and shard processor for all the work they get."""

    def __init__(self, cfg: DataConfig, out: Path, plan: dict[str, Any], workers: int, progress: bool,
                 method: str | None = None):
        self.method = method or start_method(cfg)
        ctx = mp.get_context(self.method)
        if self.method == "forkserver":
            # the fork server imports the heavy modules once; each worker forks from it already warm
            ctx.set_forkserver_preload(["data_prep.workers", "data_prep.segment", "sentencepiece",
                                        *preload_modules(cfg.segmenter)])
        self.queue = ctx.Queue() if progress else None
        self.pool = ctx.Pool(workers, initializer=_init,
                             initargs=(cfg.model_dump_json(), str(out), plan, self.queue))

    def segment(self, batches: list[list[tuple[list[str], bool]]]) -> list[list[list[tuple[str, int]]]]:
        return self.pool.map(_segment, batches, chunksize=1)

    def shards(self, shards: list[int]):
        return self.pool.imap_unordered(_shard, shards, chunksize=1)

    def close(self) -> None:
        self.pool.close()
        self.pool.join()

    def terminate(self) -> None:
        self.pool.terminate()
        self.pool.join()
