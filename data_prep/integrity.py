"""Checksums of a prepared dataset: a flipped byte or a truncated file is found, naming the file, instead of
training on it.

`merge` records every file a reader uses — the tokenizer, and each split's arrays and shard arrays — with its
size and sha256 in the manifest (`files`). Opening a dataset runs the cheap check: each file's size, and the
sha256 of every file whose size or modification time differs from what the last check saw (kept in
`.verified.json` next to the manifest; merge writes it, so a fresh dataset costs a few stat calls per file, and
an edited or copied file is rehashed; a shard's files are checked when the dataset first reads that shard, so
opening a dataset of 10,000 shards does not stat 200,000 files). `hibert prep --verify` rehashes every file (bit
rot leaves mtimes alone). Datasets prepared before checksums existed have no `files` and are not checked."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from hibert.errors import UserError

VERIFIED = ".verified.json"
BLOCK = 1 << 20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def dataset_files(root: Path, splits: tuple[str, ...], tokenizer: str) -> list[str]:
    """Relative paths of what readers of the dataset open, sorted (deterministic across machines)."""
    files = [tokenizer] if (root / tokenizer).is_file() else []
    for split in splits:
        files += sorted(str(p.relative_to(root)) for p in (root / split).rglob("*.npy"))
    return files


def record(root: Path, files: list[str]) -> dict[str, dict[str, Any]]:
    """{path: {bytes, sha256}} for the manifest; also primes the stat cache of the cheap check."""
    out = {f: {"bytes": (root / f).stat().st_size, "sha256": sha256(root / f)} for f in files}
    _write_cache(root, {f: _stat_key(root / f) for f in files})
    return out


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _write_cache(root: Path, cache: dict[str, list[int]]) -> None:
    try:  # a read-only dataset: the check stays correct, it just rehashes changed files each time
        tmp = root / f"{VERIFIED}.{os.getpid()}"
        tmp.write_text(json.dumps(cache, sort_keys=True))
        os.replace(tmp, root / VERIFIED)
    except OSError:
        pass


def read_cache(root: Path) -> dict[str, list[int]]:
    try:
        cache = json.loads((root / VERIFIED).read_text())
        return cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        return {}


def shard_files(manifest: dict[str, Any], split: str) -> dict[str, dict[str, dict[str, Any]]]:
    """The manifest's files of `split`'s shards, by shard directory name (`shard-00003`)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for rel, want in (manifest.get("files") or {}).items():
        parts = rel.split("/")
        if len(parts) == 3 and parts[0] == split and parts[1].startswith("shard-"):
            out.setdefault(parts[1], {})[rel] = want
    return out


def verify(root: Path, manifest: dict[str, Any], full: bool = False, split: str | None = None,
           shards: bool = True, files: dict[str, dict[str, Any]] | None = None,
           cache: dict[str, list[int]] | None = None) -> int:
    """Check the files the manifest lists (with `split`: that split's and the tokenizer; `shards=False`: not its
    shard directories, which a dataset checks one by one as it first reads them; `files`: just these, against
    a `cache` already read); returns how many were hashed. A missing file, another size or another sha256 is a
    UserError naming the file and what to do."""
    if files is None:
        files = manifest.get("files") or {}
        if split is not None:
            files = {f: v for f, v in files.items() if "/" not in f or f.startswith(f"{split}/")}
            if not shards:
                files = {f: v for f, v in files.items() if not f.startswith(f"{split}/shard-")}
    if not files:
        return 0
    if cache is None:
        cache = {} if full else read_cache(root)
    hashed, fresh = 0, {}
    for rel, want in files.items():
        path = root / rel
        if not path.is_file():
            raise UserError(f"{path} is missing from the prepared dataset {root}: prepare it again (hibert prep)")
        key = _stat_key(path)
        if key[0] != want["bytes"]:
            raise UserError(f"{path} has {key[0]:,} bytes, the manifest recorded {want['bytes']:,}: the dataset is "
                            "damaged (truncated or overwritten); prepare it again (hibert prep --fresh)")
        if cache.get(rel) != key:
            hashed += 1
            got = sha256(path)
            if got != want["sha256"]:
                raise UserError(f"{path} does not match its checksum in {root / 'manifest.json'} (sha256 "
                                f"{got[:12]}... != {want['sha256'][:12]}...): the dataset is damaged; prepare it "
                                "again (hibert prep --fresh)")
        fresh[rel] = key
    if hashed:
        cache.update(fresh)
        _write_cache(root, cache)
    return hashed
