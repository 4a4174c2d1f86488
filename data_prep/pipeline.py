"""`prepare`: plan -> tokenizer -> shards (in parallel, resumable) -> merge.

Local run (no shard index): everything, then the merge. Slurm array task (`shard_index`): the plan, the
tokenizer (the first task to get the lock — an flock, see `ensure_tokenizer` — trains it, the others wait), one shard. `merge_only`: the merge.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from filelock import FileLock, Timeout

from hibert.config.data import DataConfig
from hibert.data_prep import plan as planning
from hibert.data_prep import readers
from hibert.data_prep import records as R
from hibert.data_prep import tokenizer as tok
from hibert.data_prep.merge import merge
from hibert.data_prep.process import (
    SHARDS_DIR,
    STAGING,
    Sentencizer,
    ShardProcessor,
    assign_split,
    clear_staging,
    shard_done,
    shard_marker,
)
from hibert.data_prep.progress import ProgressBar, QueueListener
from hibert.data_prep.segment import check_available
from hibert.data_prep.shards import SPLITS
from hibert.data_prep.workers import WorkerPool
from hibert.errors import UserError, writable_dir

log = logging.getLogger("data_prep")
TOKENIZER_INFO = "tokenizer.json"
LOCK = "tokenizer.lock"
CHARS_PER_SENTENCE = 150        # sizing the tokenizer sample read from each input


def _tokenizer_settings(cfg: DataConfig) -> dict[str, Any]:
    t = cfg.tokenizer.model_dump(mode="json")
    if t["model"]:
        return {"model": str(Path(t["model"]).resolve()), "sha256": tok.file_sha256(Path(t["model"]))}
    return t


def _same_tokenizer(then: dict[str, Any], now: dict[str, Any]) -> bool:
    """An installed model is the same by its bytes wherever it lies now (a moved or copied data folder); a
    trained one by its settings."""
    if "sha256" in then and "sha256" in now:
        return then["sha256"] == now["sha256"]
    return then == now


def _sample_items(cfg: DataConfig, plan: dict[str, Any]) -> list[tuple[list[str], bool]]:
    """Train-split documents (and their summaries) from the start of every input, in proportion to its
    size, up to about sample_sentences sentences in all."""
    budget = cfg.tokenizer.sample_sentences * CHARS_PER_SENTENCE
    total = sum(size for s in plan["sources"] for _, size in s["units"]) or 1
    items: list[tuple[list[str], bool]] = []
    fallback: list[tuple[list[str], bool]] = []
    for si, s in enumerate(plan["sources"]):
        source = cfg.sources[si]
        for unit, size in s["units"]:
            share, chars = budget * size / total, 0
            for rec in readers.read(source, s["name"], unit, cfg.max_doc_chars):
                if not isinstance(rec, R.RawDoc):
                    continue
                split = source.split or rec.split or assign_split(rec.doc_id, cfg.valid_fraction, cfg.test_fraction)
                target = items if split == "train" else fallback
                target.append((rec.paragraphs, source.ptb_tokenized))
                if rec.summary:
                    target.append((rec.summary, source.ptb_tokenized))
                chars += sum(len(p) for p in rec.paragraphs)
                if chars >= share:
                    break
    return items or fallback


class LazyPool:
    """The worker pool, started only when there is parallel work (a rerun with nothing to do starts none)."""

    def __init__(self, cfg: DataConfig, out: Path, plan: dict[str, Any], workers: int, progress: bool):
        self.args = (cfg, out, plan, workers, progress)
        self.pool: WorkerPool | None = None

    def get(self) -> WorkerPool | None:
        if self.pool is None and self.args[3] > 1:
            self.pool = WorkerPool(*self.args)
            log.info("%d worker processes (%s)", self.args[3], self.pool.method)
        return self.pool

    def close(self, ok: bool) -> None:
        if self.pool is not None:
            self.pool.close() if ok else self.pool.terminate()
            self.pool = None


def _train_tokenizer(cfg: DataConfig, out: Path, plan: dict[str, Any], pool: WorkerPool | None,
                     sentencizer: Sentencizer) -> int:
    t0 = time.time()
    items = _sample_items(cfg, plan)
    batches = [items[i:i + cfg.segmenter.batch_size] for i in range(0, len(items), cfg.segmenter.batch_size)]
    if pool is not None:
        segmented = [s for b in pool.segment(batches) for s in b]
    else:
        segmented = [s for b in batches for s in sentencizer.sentences(b)]
    sentences = [t for sents in segmented for t, _ in sents][: cfg.tokenizer.sample_sentences]
    if not sentences:
        raise ValueError("no sentences to train the tokenizer on: every input document was skipped")
    log.info("training SentencePiece (%s, vocab %d) on %d sentences from %d documents",
             cfg.tokenizer.model_type, cfg.tokenizer.vocab_size, len(sentences), len(items))
    tok.train(sentences, cfg.tokenizer, out)
    log.info("tokenizer ready in %.1fs", time.time() - t0)
    return len(sentences)


def _existing_tokenizer(out: Path, settings: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(its description, None) when the dataset has a tokenizer made with these settings; (None, the other
    settings) when it has one made with others; (None, None) when it has none."""
    info_path, model = out / TOKENIZER_INFO, out / tok.MODEL_NAME
    if not (info_path.is_file() and model.is_file()):
        return None, None
    info = json.loads(info_path.read_text())
    if _same_tokenizer(info["settings"], settings) and info["sha256"] == tok.file_sha256(model):
        return info["describe"], None
    return None, info["settings"]


def ensure_tokenizer(cfg: DataConfig, out: Path, plan: dict[str, Any], pool: LazyPool | None,
                     fresh: bool, sentencizer: Sentencizer | None = None) -> dict[str, Any]:
    """The dataset's tokenizer.model: installed (data.tokenizer.model), reused (same settings), or trained.
    Concurrent callers (array tasks) serialize on a lock file; the first trains, the others wait."""
    info_path, model = out / TOKENIZER_INFO, out / tok.MODEL_NAME
    settings = _tokenizer_settings(cfg)
    # an flock (filelock): the kernel releases it when its holder dies, on this host or — on a shared
    # filesystem with lock support (NFS, Lustre mounted with flock) — on another node of the array
    lock = FileLock(out / LOCK)

    def reusable(locked: bool) -> dict[str, Any] | None:
        """The existing tokenizer's description when it has these settings. One with other settings is refused
        under the lock (without it, another task may be replacing it right now)."""
        described, other = _existing_tokenizer(out, settings)
        if other is not None and locked:
            raise planning.PlanMismatch(
                f"{out} has a tokenizer made with other settings ({other} != {settings}); "
                "rerun with --fresh, or point data.tokenizer.model at the model to use")
        return described

    announced = False
    while True:
        if not fresh and (described := reusable(locked=False)) is not None:
            return described
        try:
            lock.acquire(timeout=2)
        except Timeout:
            if not announced:
                log.info("waiting for the tokenizer another process is making (%s)", lock.lock_file)
                announced = True
            continue
        try:
            # again, under the lock: a holder may have just finished, or the existing one has other settings
            if not fresh and (described := reusable(locked=True)) is not None:
                return described
            info_path.unlink(missing_ok=True)
            if cfg.tokenizer.model:
                tok.install(cfg.tokenizer.model, out)
                described = tok.describe(model, cfg.tokenizer, None)
            else:
                n = _train_tokenizer(cfg, out, plan, pool.get() if pool else None, sentencizer or Sentencizer(cfg))
                described = tok.describe(model, cfg.tokenizer, n)
            planning.write_json(info_path, {"settings": settings, "sha256": described["sha256"],
                                            "describe": described})
            return described
        finally:
            lock.release()


def _merge(cfg: DataConfig, out: Path, plan: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """Merge the shards; every task that could wait on the tokenizer lock is done by then, so its file goes
    (deleting an flock file while another process may still open it would let two processes hold it)."""
    manifest = merge(cfg, out, plan, info)
    clear_staging(out)   # every shard is finished: what is left there was left by processes that died
    (out / LOCK).unlink(missing_ok=True)   # last: a prep started after this one finds no staging to lose
    return manifest


def _wipe(out: Path) -> None:
    """--fresh on a local run: forget finished shards and merged outputs (inputs stay untouched)."""
    for name in (*SPLITS, SHARDS_DIR, STAGING):
        shutil.rmtree(out / name, ignore_errors=True)
    (out / "manifest.json").unlink(missing_ok=True)


def prepare(cfg: DataConfig, *, workers: int | None = None, num_shards: int | None = None,
            shard_index: int | None = None, merge_only: bool = False, fresh: bool = False,
            tokenizer_only: bool = False, progress: bool = True) -> dict[str, Any] | None:
    """Returns the merged manifest when this call merged, else None."""
    workers = workers or cfg.workers
    out = writable_dir(cfg.output, "data.output")   # before any work: not a traceback at the first file written
    with _owner(out, shard_index):
        return _prepare(cfg, out, workers=workers, num_shards=num_shards, shard_index=shard_index,
                        merge_only=merge_only, fresh=fresh, tokenizer_only=tokenizer_only, progress=progress)


OWNER_LOCK = ".prep.lock"


@contextlib.contextmanager
def _owner(out: Path, shard_index: int | None) -> Iterator[None]:
    """One writer per output: a local prep or a merge holds `.prep.lock` for the whole run, a Slurm array task
    `.prep-shard-<i>.lock` for its shard. A second prep into the same output is refused in one line instead of
    interleaving its writes with the first's (a merge over half-written shards, a dataset that does not verify).
    The lock files stay: deleting an flock file another process may still open would let two hold it."""
    name = OWNER_LOCK if shard_index is None else f".prep-shard-{shard_index}.lock"
    lock = FileLock(str(out / name))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        what = "this output" if shard_index is None else f"shard {shard_index} of this output"
        raise UserError(f"data.output {out}: another hibert prep is writing {what} (it holds {out / name}); "
                        "wait for it to finish, or prepare into another data.output") from None
    try:
        yield
    finally:
        lock.release()


def _prepare(cfg: DataConfig, out: Path, *, workers: int, num_shards: int | None, shard_index: int | None,
             merge_only: bool, fresh: bool, tokenizer_only: bool, progress: bool) -> dict[str, Any] | None:
    if merge_only:
        plan = planning.load(out)
        if plan is None:
            raise FileNotFoundError(f"{out}/{planning.PLAN} is missing: run the shards first")
        planning.check_settings(cfg, out, plan)
        info = json.loads((out / TOKENIZER_INFO).read_text())["describe"]
        return _merge(cfg, out, plan, info)
    local = shard_index is None
    if any(not s.ptb_tokenized for s in cfg.sources):
        check_available(cfg.segmenter)
    plan = planning.resolve(cfg, out, num_shards, workers, fresh)
    if local and (reread := planning.reread_factor(plan)) > 2:
        log.warning("%d shards cut the input files into parts, and every part reads its whole file (compressed "
                    "input cannot seek): prep reads %.1fx the input. Fewer shards (data.num_shards, "
                    "data.shard_size_mb) or more, smaller input files avoid it", plan["num_shards"], reread)
    if shard_index is not None and not 0 <= shard_index < plan["num_shards"]:
        raise ValueError(f"--shard-index {shard_index} is outside 0..{plan['num_shards'] - 1}")
    if fresh and local:
        _wipe(out)
    shards = [shard_index] if shard_index is not None else list(range(plan["num_shards"]))
    pools = LazyPool(cfg, out, plan, workers, progress)
    sentencizer = Sentencizer(cfg)  # in-process work shares one segmenter (loaded on first use)
    ok = False
    try:
        info = ensure_tokenizer(cfg, out, plan, pools, fresh and local, sentencizer)
        if tokenizer_only:
            ok = True
            return None
        pending = [s for s in shards if fresh or not shard_done(out, s, plan["hash"], info["sha256"])]
        if len(pending) < len(shards):
            log.info("%d of %d shards already finished: skipped", len(shards) - len(pending), len(shards))
        for s in pending:
            shard_marker(out, s).unlink(missing_ok=True)
        _run_shards(cfg, out, plan, pending, pools.get() if len(pending) > 1 else None, sentencizer, progress)
        ok = True
    finally:
        pools.close(ok)
    if not local:
        return None
    manifest = _merge(cfg, out, plan, info)
    c = manifest["counts"]
    log.info("prepared %s: %d docs in, %d kept, skipped %s; %d chunks, %d sentences, %d tokens",
             out, c["docs_in"], c["kept"], c["skipped"], c["chunks"], c["sentences"], c["tokens"])
    return manifest


def _run_shards(cfg: DataConfig, out: Path, plan: dict[str, Any], pending: list[int], pool: WorkerPool | None,
                sentencizer: Sentencizer, progress: bool) -> None:
    if not pending:
        return
    bar = ProgressBar(f"prep {out.name}", enabled=progress)
    try:
        if pool is not None:
            listener = QueueListener(pool.queue, bar) if pool.queue is not None else None
            try:
                for result in pool.shards(pending):
                    _log_shard(result)
            finally:
                if listener:
                    listener.stop()
        else:
            processor = ShardProcessor(cfg, out, plan, sentencizer)
            for s in pending:
                _log_shard(processor.run(s, bar.update if progress else None))
    finally:
        bar.close()


def _log_shard(result: dict[str, Any]) -> None:
    c = result["counts"]
    log.info("shard %d: %d docs in, %d kept, %d words in %.1fs", result["shard"], c["docs_in"], c["kept"],
             c["words"], result["seconds"])
