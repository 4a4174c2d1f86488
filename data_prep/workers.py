"""Worker processes: each builds its segmenter (and, once the tokenizer exists, its shard processor) once
and then serves segmentation batches (tokenizer sample) and whole shards."""
from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any

from hibert.config.data import DataConfig

from data_prep.process import Sentencizer, ShardProcessor
from data_prep.segment import preload_modules

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


class WorkerPool:
    """A process pool (forkserver: children start clean, whatever threads the parent runs; measured faster
    than plain fork here too)."""

    def __init__(self, cfg: DataConfig, out: Path, plan: dict[str, Any], workers: int, progress: bool):
        ctx = mp.get_context("forkserver")
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
