"""Plain text: documents separated by blank lines (a document's lines are one paragraph)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from hibert.config.data import SourceConfig
from hibert.data_prep import records as R
from hibert.data_prep.readers.files import expand, file_units, open_binary, sha256_file


def list_units(source: SourceConfig) -> list[tuple[str, int]]:
    return file_units(expand(source.path, (".txt", ".txt.gz")))


def checksum(source: SourceConfig, unit: str) -> str:
    return sha256_file(Path(unit))


def _blocks(unit: str, limit: int) -> Iterator[tuple[int, list[bytes], int]]:
    """(first line, lines, size) of each blank-line separated block; content beyond `limit` is dropped."""
    lines: list[bytes] = []
    start = size = 0
    with open_binary(Path(unit), limit) as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip(b" \t\r\n\f\v"):
                if size:
                    yield start, lines, size
                lines, size = [], 0
                continue
            if not size:
                start = lineno
            size += len(raw)
            if size <= limit:
                lines.append(raw)
    if size:
        yield start, lines, size


def read(source: SourceConfig, name: str, unit: str, max_chars: int,
         part: int, parts: int) -> Iterator[R.RawDoc | R.Skip]:
    stem = Path(unit).name.split(".")[0]
    for i, (line, lines, size) in enumerate(_blocks(unit, 4 * max_chars)):
        if i % parts != part:
            continue
        if size > 4 * max_chars:
            yield R.Skip(R.TOO_LONG, unit, line, f"over {4 * max_chars} bytes")
            continue
        text = R.decode(b"".join(lines))
        if text is None:
            yield R.Skip(R.INVALID_UTF8, unit, line)
            continue
        reason = R.check_text(text, max_chars)
        if reason:
            yield R.Skip(reason, unit, line)
            continue
        yield R.RawDoc(f"{name}:{stem}:{line}", [" ".join(text.split())], None, unit, line)
