"""Short content hashes that tie reports, exports and runs to the exact files they read."""
from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    """A file's sha256 (hex), read in 1 MiB blocks: no file is held in memory whole, however large."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_hash(path: Path) -> str:
    """The first 16 hex digits of a file's sha256 (shards and manifests can be large)."""
    return file_sha256(path)[:16]
