"""Checkpoints: DeepSpeed's save_checkpoint on every rank, plus our own completion marker.

Layout under the checkpoint dir:
    step_000001000/            DeepSpeed tag (model/optimizer/scheduler shards from every rank)
        rng_rank00000.safetensors ...   per-rank RNG state
        COMPLETE.json          written by rank 0 after EVERY rank finished: step, world size, client
                               state, and the size of every file in the tag
A tag without COMPLETE.json, or whose files no longer match the recorded sizes (truncated copy, disk
full), is skipped on resume with a warning; the newest good one wins. Only the last `keep_last` complete
tags are kept. Training state we need (step, epoch, consumed micro-batches, seeds, MLflow run id, config
hash) lives in COMPLETE.json, so resuming reads it without unpickling anything of ours.
"""
from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pretrain.rng_state import load_rng_state, save_rng_state

log = logging.getLogger(__name__)
MARKER = "COMPLETE.json"
PREFIX = "step_"
UNIVERSAL = "_universal"


@dataclass
class Resumable:
    tag: str
    path: Path
    state: dict[str, Any]


def tag_for(step: int) -> str:
    return f"{PREFIX}{step:09d}"


def _file_sizes(tag_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(tag_dir)): p.stat().st_size
            for p in sorted(tag_dir.rglob("*")) if p.is_file() and p.name != MARKER}


def verify(tag_dir: Path) -> tuple[bool, str]:
    marker = tag_dir / MARKER
    if not marker.is_file():
        return False, "no completion marker (the save did not finish on every rank)"
    try:
        meta = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return False, f"unreadable marker: {e}"
    for rel, size in meta.get("files", {}).items():
        f = tag_dir / rel
        if not f.is_file():
            return False, f"missing file {rel}"
        if f.stat().st_size != size:
            return False, f"{rel} has {f.stat().st_size} bytes, expected {size} (truncated?)"
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
        """Collective: every rank must call it."""
        tag = tag_for(step)
        tag_dir = self.root / tag
        if self.rank == 0 and tag_dir.exists():  # a stale partial save of the same step
            shutil.rmtree(tag_dir)
        dist.barrier()
        from deepspeed.checkpoint.constants import (UNIVERSAL_CHECKPOINT_INFO, UNIVERSAL_CHECKPOINT_VERSION_KEY,
                                                    UNIVERSAL_CHECKPOINT_VERSION_VALUE)

        # The universal-checkpoint info lets a later run with another world size convert this tag.
        engine.save_checkpoint(str(self.root), tag=tag, save_latest=False, client_state={
            UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}})
        save_rng_state(tag_dir / f"rng_rank{self.rank:05d}.safetensors")
        dist.barrier()  # every rank's shards are on disk before the marker says so
        if self.rank == 0:
            meta = {"step": step, "world_size": self.world, "state": state, "files": _file_sizes(tag_dir)}
            tmp = tag_dir / (MARKER + ".tmp")
            tmp.write_text(json.dumps(meta, indent=1))
            tmp.replace(tag_dir / MARKER)
            self._prune()
        dist.barrier()
        return tag_dir

    def _prune(self) -> None:
        good = [t for t in complete_tags(self.root) if (t / MARKER).is_file()]
        for old in good[self.keep_last:]:
            shutil.rmtree(old, ignore_errors=True)

    def candidates(self) -> list[Resumable]:
        """Verified resumable tags, newest first (rank 0 decides, everyone gets the same list)."""
        found: list[Resumable] = []
        if self.rank == 0:
            for t in complete_tags(self.root):
                ok, why = verify(t)
                if ok:
                    found.append(Resumable(t.name, t, json.loads((t / MARKER).read_text())["state"]))
                else:
                    log.warning("checkpoint %s skipped: %s", t, why)
        box = [[(r.tag, str(r.path), r.state) for r in found]]
        dist.broadcast_object_list(box, src=0)
        return [Resumable(tag, Path(p), s) for tag, p, s in box[0]]

    def _load_universal(self, engine, c: Resumable):
        """Another world size: convert the tag to DeepSpeed's universal format once (rank 0), then load
        it with universal loading switched on (optimizer state is re-partitioned for this world)."""
        import subprocess
        import sys

        target = self.root / f"{c.tag}{UNIVERSAL}"
        if self.rank == 0 and not (target / MARKER).is_file():
            shutil.rmtree(target, ignore_errors=True)
            log.info("converting %s (world size %s) to a universal checkpoint for world size %d",
                     c.path, c.state.get("world_size"), self.world)
            out = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                                  str(c.path), "--output_folder", str(target), "--num_extract_workers", "1",
                                  "--num_merge_workers", "1"], capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"universal conversion of {c.path} failed: {out.stderr[-2000:]}")
            (target / MARKER).write_text(json.dumps({"from": c.tag}))
        dist.barrier()
        engine._config.load_universal_checkpoint = True
        try:
            path, _ = engine.load_checkpoint(str(self.root), tag=target.name)
        finally:
            engine._config.load_universal_checkpoint = False
        return path

    def resume(self, engine, explicit: str | None = None) -> Resumable | None:
        """Load the newest good checkpoint (or `explicit`). Collective. Returns None when there is none."""
        cands = self.candidates()
        if explicit:
            cands = [c for c in cands if c.tag == Path(explicit).name or str(c.path) == explicit]
            if not cands:
                raise FileNotFoundError(f"checkpoint.resume={explicit!r} is not a complete checkpoint in {self.root}")
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
            flag = torch.tensor([ok], dtype=torch.int64)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if flag.item() == 1:
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
