"""Path expansion and file opening shared by the file-based readers."""
from __future__ import annotations

import glob
import gzip
import hashlib
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from hibert.errors import UserError


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


class Lines:
    """The lines of a file, gzipped or plain (by magic number rather than suffix: LDC ships both). Damaged gzip
    data (truncated, corrupt) is a UserError naming the file and the last line read, not a bare traceback."""

    def __init__(self, path: Path, max_line_bytes: int | None = None) -> None:
        self.path = Path(path)
        # a line longer than this is yielded cut to max_line_bytes + 1 bytes (the reader then skips it as too
        # long) and the rest is read past: a file without newlines must not be held in memory whole
        self.limit = max_line_bytes
        with open(self.path, "rb") as f:
            magic = f.read(2)
        self.file: BinaryIO = gzip.open(self.path, "rb") if magic == b"\x1f\x8b" else open(self.path, "rb")

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()

    def __iter__(self) -> Iterator[bytes]:
        n = 0
        try:
            if self.limit is None:
                for raw in self.file:
                    n += 1
                    yield raw
                return
            while raw := self.file.readline(self.limit + 1):
                if len(raw) > self.limit and not raw.endswith(b"\n"):
                    while (rest := self.file.readline(1 << 20)) and not rest.endswith(b"\n"):
                        pass
                n += 1
                yield raw
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            where = f"after line {n:,}" if n else "before its first line"
            raise UserError(f"{self.path}: damaged gzip data {where} ({e}); the file is truncated or corrupt: "
                            "fetch or compress it again") from None


def open_binary(path: Path, max_line_bytes: int | None = None) -> Lines:
    return Lines(path, max_line_bytes)


def file_units(paths: list[Path]) -> list[tuple[str, int]]:
    return [(str(p), p.stat().st_size) for p in paths]


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()
