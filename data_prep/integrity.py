"""Checksums of a prepared dataset: a flipped byte or a truncated file is found, naming the file, instead of
training on it.

`merge` records the size and sha256 of every file a reader uses. The manifest (`files`) lists the tokenizer,
each split's own arrays, and one `checksums.json` per shard directory, which in turn lists that shard's arrays:
the manifest grows by one entry per shard, not twenty, so opening a split of 10,000 shards parses 10,000
records rather than 200,000. Opening a dataset runs the cheap check on the split's own files: each file's size,
and the sha256 of every file whose size or modification time differs from what the last check saw (a
`.verified.json` per directory, primed by merge, so a fresh dataset costs a few stat calls, and an edited or
copied file is rehashed). A shard's files are checked the same way when the dataset first reads that shard.
`hibert prep --verify` rehashes every file (bit rot leaves mtimes alone). Datasets prepared before checksums
existed have no `files`: opening one warns, and `hibert prep --record-checksums` records the files as they are
then (the manifest changes, and with it the dataset hash that exports and MLflow tags record); those whose
manifest lists every shard file are checked as listed."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from hibert.errors import UserError

VERIFIED = ".verified.json"   # per directory: {file name: [size, mtime_ns]} of the files last found intact
CHECKSUMS = "checksums.json"  # per shard directory: {file name: {bytes, sha256}}
BLOCK = 1 << 20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def _entry(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256(path)}


def record(root: Path, splits: tuple[str, ...], tokenizer: str) -> dict[str, dict[str, Any]]:
    """The manifest's `files`: {relative path: {bytes, sha256}} of the tokenizer, each split's arrays and each
    shard's `checksums.json` (written here, sorted: the same bytes on every machine); primes every directory's
    stat cache. Sorted paths: deterministic across machines."""
    files: dict[str, dict[str, Any]] = {}
    if (root / tokenizer).is_file():
        files[tokenizer] = _entry(root / tokenizer)
    _write_cache(root, {tokenizer: _stat_key(root / tokenizer)} if files else {})
    for split in splits:
        own = {p.name: _entry(p) for p in sorted((root / split).glob("*.npy"))}
        listed = {}
        for shard in sorted(p for p in (root / split).glob("shard-*") if p.is_dir()):
            table = {p.name: _entry(p) for p in sorted(shard.glob("*.npy"))}
            (shard / CHECKSUMS).write_text(json.dumps(table, sort_keys=True, indent=0) + "\n", encoding="utf-8")
            _write_cache(shard, {name: _stat_key(shard / name) for name in (*table, CHECKSUMS)})
            listed[f"{shard.name}/{CHECKSUMS}"] = _entry(shard / CHECKSUMS)
        _write_cache(root / split, {name: _stat_key(root / split / name) for name in own})
        files.update({f"{split}/{name}": e for name, e in sorted({**own, **listed}.items())})
    return files


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _write_cache(directory: Path, cache: dict[str, list[int]]) -> None:
    try:  # a read-only dataset: the check stays correct, it just rehashes changed files each time
        tmp = directory / f"{VERIFIED}.{os.getpid()}"
        tmp.write_text(json.dumps(cache, sort_keys=True))
        os.replace(tmp, directory / VERIFIED)
    except OSError:
        pass


def read_cache(directory: Path) -> dict[str, list[int]]:
    try:
        cache = json.loads((directory / VERIFIED).read_text())
        return cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        return {}


def shard_files(manifest: dict[str, Any], split: str) -> dict[str, dict[str, dict[str, Any]]]:
    """The manifest's files of `split`'s shards, by shard directory name (`shard-00003`): its `checksums.json`,
    or, in datasets merged before those existed, each of its arrays."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for rel, want in (manifest.get("files") or {}).items():
        parts = rel.split("/")
        if len(parts) == 3 and parts[0] == split and parts[1].startswith("shard-"):
            out.setdefault(parts[1], {})[rel] = want
    return out


def verify(root: Path, manifest: dict[str, Any], full: bool = False, split: str | None = None,
           shards: bool = True, files: dict[str, dict[str, Any]] | None = None) -> int:
    """Check the files the manifest lists (with `split`: that split's and the tokenizer; `shards=False`: not its
    shard directories, which a dataset checks one by one as it first reads them; `files`: just these), and the
    files each listed `checksums.json` lists; returns how many were hashed. A missing file, another size or
    another sha256 is a UserError naming the file and what to do."""
    if files is None:
        files = manifest.get("files") or {}
        if split is not None:
            files = {f: v for f, v in files.items() if "/" not in f or f.startswith(f"{split}/")}
            if not shards:
                files = {f: v for f, v in files.items() if not f.startswith(f"{split}/shard-")}
    by_dir: dict[str, dict[str, dict[str, Any]]] = {}
    for rel, want in files.items():
        parent, _, name = rel.rpartition("/")
        by_dir.setdefault(parent, {})[name] = want
    return sum(_check_dir(root, parent, wanted, full) for parent, wanted in by_dir.items())


def _check_dir(root: Path, parent: str, wanted: dict[str, dict[str, Any]], full: bool) -> int:
    directory = root / parent if parent else root
    cache = {} if full else read_cache(directory)
    hashed, fresh = 0, {}
    for name, want in wanted.items():
        path = directory / name
        if not path.is_file():
            raise UserError(f"{path} is missing from the prepared dataset {root}: prepare it again (hibert prep)")
        key = _stat_key(path)
        if key[0] != want["bytes"]:
            raise UserError(f"{path} has {key[0]:,} bytes, {_source(root, parent, name)} recorded {want['bytes']:,}: "
                            "the dataset is damaged (truncated or overwritten); prepare it again (hibert prep --fresh)")
        if cache.get(name) != key:
            hashed += 1
            got = sha256(path)
            if got != want["sha256"]:
                raise UserError(f"{path} does not match its checksum in {_source(root, parent, name)} (sha256 "
                                f"{got[:12]}... != {want['sha256'][:12]}...): the dataset is damaged; prepare it "
                                "again (hibert prep --fresh)")
        fresh[name] = key
        if name == CHECKSUMS:  # intact: now the files it lists
            try:
                table = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as e:
                raise UserError(f"{path} is not a checksum table ({e}): prepare the dataset again") from None
            hashed += _check_dir(root, parent, {n: w for n, w in table.items() if n != CHECKSUMS}, full)
    if hashed:  # re-read: the check of a checksums.json's files above may have written this directory's cache
        _write_cache(directory, {**read_cache(directory), **fresh})
    return hashed


def _source(root: Path, parent: str, name: str) -> str:
    """Where a file's expected size and sha256 come from: the manifest, or its shard's checksums.json."""
    if parent.count("/") == 1 and name != CHECKSUMS:
        return str(root / parent / CHECKSUMS) if (root / parent / CHECKSUMS).is_file() else "the manifest"
    return "the manifest"
