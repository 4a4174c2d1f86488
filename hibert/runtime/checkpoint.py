"""Checkpoints: DeepSpeed's save_checkpoint on every rank, plus our own completion marker.

Layout under the checkpoint dir:
    step_000001000/            DeepSpeed tag (model/optimizer/scheduler shards from every rank)
        rng_rank00000.safetensors ...   per-rank RNG state
        COMPLETE.json          written by rank 0 after EVERY rank finished: the writer's format
                               ("hibert-checkpoint/1"), step, world size, client state, and for every
                               file in the tag its size and a sha256 of its first and last 1 MiB
    step_000001000_universal/  DeepSpeed universal format of that tag (made when resuming on another
                               world size), with its own marker naming the source marker's sha256

DeepSpeed loads its shards with pickle (torch.load weights_only=False), so a tag is only loaded when its
marker is one this platform wrote and still describes the directory: a tag without a marker, with a
marker lacking our format (another tool, an older version), with a file missing, unlisted, of another
size (truncated copy, disk full) or with another head/tail fingerprint (a file swapped or rewritten) is
skipped on resume with the reason; the newest good one wins, and an explicit `checkpoint.resume=` that
fails the check is an error naming the reason. When only foreign-marker tags are there, resuming is an
error too (not a silent fresh start over them): `checkpoint.resume=never` starts over on purpose.

Durability: every rank fsyncs the tag's files before the barrier that precedes the marker, and the marker is
fsynced before its rename and its directory after, so a node that crashes or loses power never leaves a
marker over files still in some machine's page cache (the fingerprints read only each file's ends).

Why head+tail and not a full hash: shards are multi-GB (Adam state is ~12 bytes per parameter), and rank
0 fingerprints every file on each save (all ranks wait) and on each resume; a full sha256 would read the
whole checkpoint twice per save/resume, while 2 MiB per file is constant. It is still meaningful for
torch files: torch.save writes the pickle program (`data.pkl`, what runs on load) as the zip's first
record and the zip directory (names, offsets, CRC-32 of every record) at the end, so both are covered,
together with the exact size. This guards against loading what our jobs did not write by accident
(foreign or stale directories, partial copies, swapped shards); it is not a signature: whoever can write
the checkpoint dir can also write a matching marker, so that directory must be writable only by the
jobs' owner (see docs/cluster.md, "Resume and preemption").

Only the last `keep_last` tags with our marker are kept (others are never deleted). Training state we
need (step, epoch, consumed micro-batches, seeds, MLflow run id, config hash) lives in COMPLETE.json,
so resuming reads it without unpickling anything of ours.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hibert.durable import fsync_dir, write_atomic
from hibert.errors import DiskFull, disk_full
from hibert.runtime.collectives import reduce_device
from hibert.runtime.rng_state import load_rng_state, save_rng_state

log = logging.getLogger(__name__)
MARKER = "COMPLETE.json"
PREFIX = "step_"
UNIVERSAL = "_universal"
SUPERSEDED = "superseded-"   # tags of a timeline a resumed run left (see CheckpointManager._prune)
FORMAT = "hibert-checkpoint/1"          # who wrote the marker; markers without it are refused
FINGERPRINT = "sha256-head-tail-1MiB"   # how `fingerprints` are computed (recorded in the marker)
_EDGE = 1 << 20
NOT_OURS = "marker not written by this platform"


def all_ranks_ok(ok: int) -> bool:
    """Collective: whether every rank's `ok` is 1. One process asks no one; several reduce on the device
    the default group's backend takes (`reduce_device`)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return ok == 1
    flag = torch.tensor([ok], dtype=torch.int64, device=reduce_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return flag.item() == 1


@dataclass
class Resumable:
    tag: str
    path: Path
    state: dict[str, Any]


def _param_groups(engine) -> list[dict[str, Any]]:
    """The torch optimizer's param groups under DeepSpeed's ZeRO wrapper."""
    opt = engine.optimizer
    return list(getattr(getattr(opt, "optimizer", opt), "param_groups", []))


def tag_for(step: int) -> str:
    return f"{PREFIX}{step:09d}"


def _files(tag_dir: Path) -> list[Path]:
    # .nfs* are NFS silly-rename leftovers of deleted-while-open files, not checkpoint content
    return [p for p in sorted(tag_dir.rglob("*"))
            if p.is_file() and p.name not in (MARKER, MARKER + ".tmp") and not p.name.startswith(".nfs")]


def _file_sizes(tag_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(tag_dir)): p.stat().st_size for p in _files(tag_dir)}


def fingerprint(path: Path) -> str:
    """sha256 of the size and the first and last 1 MiB (the whole file when it is at most 2 MiB)."""
    size = path.stat().st_size
    h = hashlib.sha256(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        if size <= 2 * _EDGE:
            h.update(f.read())
        else:
            h.update(f.read(_EDGE))
            f.seek(size - _EDGE)
            h.update(f.read(_EDGE))
    return h.hexdigest()


def marker_for(tag_dir: Path, **fields: Any) -> dict[str, Any]:
    """The marker this platform writes for `tag_dir` as it is now: our format, `fields` (step,
    world_size, state, ...), every file's size and fingerprint."""
    sizes = _file_sizes(tag_dir)
    return {"format": FORMAT, **fields, "files": sizes, "fingerprint": FINGERPRINT,
            "fingerprints": {rel: fingerprint(tag_dir / rel) for rel in sizes}}


def write_marker(tag_dir: Path, **fields: Any) -> Path:
    """Atomically and durably write `marker_for(tag_dir, **fields)` as the tag's COMPLETE.json: its bytes reach
    the disk before the rename, and the rename before this returns (a machine that loses power keeps either
    the old marker or the new one, never an empty file under the final name)."""
    # a fixed temporary name: `_files` leaves it out, so one a crash left behind never fails `verify`
    write_atomic(tag_dir / MARKER, json.dumps(marker_for(tag_dir, **fields), indent=1), tmp=tag_dir / (MARKER + ".tmp"))
    return tag_dir / MARKER


def flush_files(tag_dir: Path) -> None:
    """fsync every file of the tag. What a process writes sits in its machine's page cache until the kernel
    writes it back: a node that crashes or loses power after the marker was written would leave a tag that
    claims to be complete over files that never reached the disk (or a shared filesystem's server), and the
    marker's fingerprints only read each file's first and last MiB. Every rank calls this before the barrier
    that precedes the marker, so each machine flushes what it wrote (flushing a clean file is cheap)."""
    for path in _files(tag_dir):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # pruned or renamed by another rank meanwhile: nothing of ours to flush
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(tag_dir)


def read_marker(tag_dir: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((tag_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _ours(tag_dir: Path) -> bool:
    """Cheap: the marker claims our format (no file checks; `verify` does those)."""
    meta = read_marker(tag_dir)
    return meta is not None and meta.get("format") == FORMAT


def verify(tag_dir: Path) -> tuple[bool, str]:
    """(True, "ok") when `tag_dir` holds exactly what our marker recorded; else (False, why)."""
    marker = tag_dir / MARKER
    if not marker.is_file():
        return False, "no completion marker (the save did not finish on every rank)"
    try:
        meta = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return False, f"unreadable marker: {e}"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        return False, (f"{NOT_OURS} (format {found!r}, expected {FORMAT!r}; an older version or another "
                       f"tool): its pickled shards are not loaded")
    files, prints = meta.get("files"), meta.get("fingerprints")
    if not isinstance(files, dict) or not isinstance(prints, dict) or meta.get("fingerprint") != FINGERPRINT \
            or set(files) != set(prints) or not files:
        return False, "marker has no file list with fingerprints"
    for rel, size in files.items():
        f = tag_dir / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            return False, f"marker lists a path outside the tag: {rel}"
        if not f.is_file():
            return False, f"missing file {rel}"
        if f.stat().st_size != size:
            return False, f"{rel} has {f.stat().st_size} bytes, expected {size} (truncated?)"
    unlisted = sorted(set(_file_sizes(tag_dir)) - set(files))
    if unlisted:
        return False, f"files not in the marker: {unlisted[:5]}"
    for rel, want in prints.items():
        if fingerprint(tag_dir / rel) != want:
            return False, f"{rel} does not match its recorded fingerprint (rewritten or swapped?)"
    return True, "ok"


def complete_tags(root: Path) -> list[Path]:
    """Tags with a marker, newest first (by step)."""
    if not root.is_dir():
        return []
    tags = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and not p.name.endswith(UNIVERSAL)]
    return sorted(tags, key=lambda p: p.name, reverse=True)


class CheckpointManager:
    def __init__(self, root: Path, keep_last: int, rank: int, world_size: int):
        self.root, self.keep_last, self.rank, self.world = Path(root), keep_last, rank, world_size

    def save(self, engine, step: int, state: dict[str, Any]) -> Path:
        """Collective: every rank must call it. Raises DiskFull on every rank, before anything is written,
        when the filesystem cannot hold another tag (the previous complete one is left as it is)."""
        tag = tag_for(step)
        tag_dir = self.root / tag
        if self.rank == 0 and tag_dir.exists():  # a stale partial save of the same step
            shutil.rmtree(tag_dir)
        self._check_space(engine, step)
        dist.barrier()
        from deepspeed.checkpoint.constants import (  # lazy: DeepSpeed ~2.5 s; a rank imports it in build_engine
            UNIVERSAL_CHECKPOINT_INFO,
            UNIVERSAL_CHECKPOINT_VERSION_KEY,
            UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        )

        # The universal-checkpoint info lets a later run with another world size convert this tag.
        try:
            engine.save_checkpoint(str(self.root), tag=tag, save_latest=False, client_state={
                UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}})
            save_rng_state(tag_dir / f"rng_rank{self.rank:05d}.safetensors")
            flush_files(tag_dir)
        except (OSError, RuntimeError) as e:
            # torch.save reports ENOSPC as "file write failed" without the errno: the free space tells
            if disk_full(e) or shutil.disk_usage(self.root).free < 2**20:
                raise DiskFull(self._full_message(step, "the disk filled up while it was written")) from None
            raise
        dist.barrier()  # every rank's shards are on disk (flushed) before the marker says so
        if self.rank == 0:
            write_marker(tag_dir, step=step, world_size=self.world, state=state)
            self._prune(tag_dir)
        dist.barrier()
        return tag_dir

    def restate(self, step: int, state: dict[str, Any]) -> bool:
        """Collective. Record `state` in the marker of this step's complete tag (its weights are this step's: the
        caller wrote it or resumed from it), atomically: the tag is never absent. False when it does not verify."""
        ok = [False]
        if self.rank == 0:
            tag_dir = self.root / tag_for(step)
            meta = read_marker(tag_dir) if tag_dir.is_dir() else None
            # (a tag of another world size, resumed through its universal conversion, is written again instead)
            if meta is not None and meta.get("world_size") == self.world and verify(tag_dir)[0]:
                write_marker(tag_dir, step=step, world_size=self.world, state=state)
                ok = [True]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(ok, src=0)
        return ok[0]

    def _check_space(self, engine, step: int) -> None:
        """Rank 0 compares the free space with what the next tag needs (the newest tag's size, or ~16 bytes
        per parameter before the first: fp32 weights + Adam's fp32 master and two moments, +20%); every rank
        learns the answer (one broadcast) so all refuse together instead of one failing mid-write."""
        verdict = [None]
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            tags = [t for t in complete_tags(self.root) if _ours(t)]
            need = (sum(p.stat().st_size for p in _files(tags[0])) if tags else
                    int(1.2 * 16 * sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())))
            free = shutil.disk_usage(self.root).free
            if free < need:
                verdict = [self._full_message(step, f"it needs ~{need / 2**20:,.1f} MB, "
                                                    f"{free / 2**20:,.1f} MB are free")]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(verdict, src=0)
        if verdict[0]:
            raise DiskFull(verdict[0])

    def _full_message(self, step: int, why: str) -> str:
        tags = [t for t in complete_tags(self.root) if _ours(t)]
        kept = f"the newest complete checkpoint, {tags[0].name}, is intact" if tags else "no earlier checkpoint"
        return (f"no space for checkpoint step {step} in {self.root} ({why}); {kept}. Free space (or set "
                "checkpoint.keep_last lower) and start the run again: it resumes from the newest complete checkpoint")

    def _prune(self, current: Path) -> None:
        """Keep the `keep_last` newest tags up to `current`, the one just written. A tag past it is from a timeline
        this run left (resumed from an older tag: a rollback, a corrupt newest tag skipped): set aside as
        `superseded-<tag>`, never resumed from, never counted, never deleted — it would otherwise outrank (and
        push out) what this run writes. Only tags our marker claims count: a foreign directory is neither trusted
        nor removed."""
        good = [t for t in complete_tags(self.root) if _ours(t)]
        for newer in [t for t in good if t.name > current.name]:
            target, n = newer.with_name(f"{SUPERSEDED}{newer.name}"), 1
            while target.exists():
                n += 1
                target = newer.with_name(f"{SUPERSEDED}{newer.name}-{n}")
            newer.rename(target)
        for old in [t for t in good if t.name <= current.name][self.keep_last:]:
            shutil.rmtree(old, ignore_errors=True)

    def _verified(self) -> tuple[list[Resumable], dict[str, str]]:
        """Verified resumable tags newest first, and why the others were skipped (rank 0 decides,
        every rank gets the same answer)."""
        found: list[Resumable] = []
        skipped: dict[str, str] = {}
        if self.rank == 0:
            for t in complete_tags(self.root):
                ok, why = verify(t)
                if ok:
                    found.append(Resumable(t.name, t, json.loads((t / MARKER).read_text())["state"]))
                else:
                    skipped[t.name] = why
                    log.warning("checkpoint %s skipped: %s", t, why)
        box = [[(r.tag, str(r.path), r.state) for r in found], skipped]
        dist.broadcast_object_list(box, src=0)
        return [Resumable(tag, Path(p), s) for tag, p, s in box[0]], box[1]

    def candidates(self) -> list[Resumable]:
        """Verified resumable tags, newest first (rank 0 decides, everyone gets the same list)."""
        return self._verified()[0]

    def _load_universal(self, engine, c: Resumable):
        """Another world size: convert the tag to DeepSpeed's universal format once (rank 0), then load
        it with universal loading switched on (optimizer state is re-partitioned for this world)."""

        target = self.root / f"{c.tag}{UNIVERSAL}"
        source_marker = hashlib.sha256((c.path / MARKER).read_bytes()).hexdigest() if self.rank == 0 else ""
        reuse = False
        if self.rank == 0 and (target / MARKER).is_file():
            ok, why = verify(target)
            reuse = ok and (read_marker(target) or {}).get("source_marker_sha256") == source_marker
            if not reuse:
                log.warning("universal checkpoint %s not reused (%s); converting again", target,
                            why if not ok else f"made from another {c.tag}")
        if self.rank == 0 and not reuse:
            shutil.rmtree(target, ignore_errors=True)
            log.info("converting %s (world size %s) to a universal checkpoint for world size %d",
                     c.path, c.state.get("world_size"), self.world)
            out = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                                  str(c.path), "--output_folder", str(target), "--num_extract_workers", "1",
                                  "--num_merge_workers", "1"], capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"universal conversion of {c.path} failed: {out.stderr[-2000:]}")
            write_marker(target, source=c.tag, source_marker_sha256=source_marker)
        dist.barrier()
        groups = _param_groups(engine)
        hyper = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in groups]
        engine._config.load_universal_checkpoint = True
        try:
            path, _ = engine.load_checkpoint(str(self.root), tag=target.name)
        finally:
            engine._config.load_universal_checkpoint = False
        if path is not None and engine.zero_optimization_stage() == 3:
            # DeepSpeed's ZeRO-3 universal load gives every param group the hyperparameters of group 0
            # (stage3.load_hp_checkpoint_state_from_checkpoint_dir_stage3): the no-decay group would be decayed.
            # Each group's own come from this run's config; its lr from the restored scheduler.
            last_lr = engine.lr_scheduler.get_last_lr() if engine.lr_scheduler is not None else None
            for i, (g, h) in enumerate(zip(groups, hyper)):
                g.update(h)
                if last_lr is not None:
                    g["lr"] = last_lr[i]
            if self.rank == 0:
                # upstream: ZeRO-3 universal checkpoints assume one param group (DeepSpeed PR #7585's discussion)
                log.warning("ZeRO-3 on another world size: DeepSpeed's universal load does not restore an optimizer "
                            "with several param groups exactly (weights ~1e-4 off an uninterrupted run two steps "
                            "later in the tests, against 1e-6 for ZeRO-2); resume on %s rank(s) to continue exactly",
                            c.state.get("world_size"))
        return path

    def resume(self, engine, explicit: str | None = None) -> Resumable | None:
        """Load the newest good checkpoint (or `explicit`). Collective. Returns None when there is none."""
        cands, skipped = self._verified()
        if explicit:
            cands = [c for c in cands if c.tag == Path(explicit).name or str(c.path) == explicit]
            if not cands:
                why = skipped.get(Path(explicit).name)
                raise FileNotFoundError(f"checkpoint.resume={explicit!r} is not a complete checkpoint in {self.root}"
                                        + (f": {why}" if why else ""))
        foreign = sorted(t for t, why in skipped.items() if why.startswith(NOT_OURS))
        if not cands and foreign:  # e.g. tags of a version before markers named their writer: never
            # unpickle them, and never silently start over on top of them either
            raise RuntimeError(f"the checkpoints in {self.root} ({foreign}) were not written by this platform "
                               f"(no {FORMAT!r} marker): resume them with the version that wrote them, move them "
                               f"away, or set checkpoint.resume=never to start over")
        for c in cands:
            ok = 1
            try:
                if c.state.get("world_size", self.world) != self.world:
                    path = self._load_universal(engine, c)
                else:
                    path, _ = engine.load_checkpoint(str(self.root), tag=c.tag)
                ok = int(path is not None)
            except Exception as e:  # corrupt shard content with the right size
                log.warning("checkpoint %s failed to load (%s); trying an older one", c.path, e)
                ok = 0
            if all_ranks_ok(ok):
                rng = c.path / f"rng_rank{self.rank:05d}.safetensors"
                if c.state.get("world_size") == self.world and rng.is_file():
                    load_rng_state(rng)
                return c
            if self.rank == 0:
                log.warning("checkpoint %s unusable on some rank; trying an older one", c.path)
        if cands:  # never silently restart from scratch over existing training state
            raise RuntimeError(f"none of the complete checkpoints in {self.root} could be loaded "
                               f"({[c.tag for c in cands]}); fix or remove them, or set checkpoint.resume=never")
        return None
