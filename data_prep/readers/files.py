"""Path expansion and file opening shared by the file-based readers."""
from __future__ import annotations

import glob
import gzip
import hashlib
import os
from pathlib import Path
from typing import BinaryIO


def expand(path: str, suffixes: tuple[str, ...] = ()) -> list[Path]:
    """A file, a directory (walked recursively, files ending with one of `suffixes` if given) or a glob."""
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        found = [Path(root) / f for root, _, files in os.walk(p) for f in files
                 if not f.startswith(".") and (not suffixes or f.endswith(suffixes))]
        return sorted(found)
    return sorted(Path(x) for x in glob.glob(path, recursive=True) if Path(x).is_file())


def open_binary(path: Path) -> BinaryIO:
    """Gzipped or plain, by magic number rather than suffix (LDC ships both)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def file_units(paths: list[Path]) -> list[tuple[str, int]]:
    return [(str(p), p.stat().st_size) for p in paths]


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()
