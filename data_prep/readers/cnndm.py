"""CNN/DailyMail `.story` files (Hermann et al.): article paragraphs, then `@highlight` blocks whose next
line is one summary sentence. A directory (or glob) of story files is one unit; its records are the files."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from hibert.config.data import SourceConfig
from hibert.data_prep import records as R
from hibert.data_prep.readers.files import expand, sha256_file


def _files(source: SourceConfig) -> list[Path]:
    return expand(source.path, (".story",))


def list_units(source: SourceConfig) -> list[tuple[str, int]]:
    files = _files(source)
    return [(source.path, sum(p.stat().st_size for p in files))] if files else []


def checksum(source: SourceConfig, unit: str) -> str:
    """sha256 over (name, sha256 of content) of every story file in order: one checksum for the set."""
    h = hashlib.sha256()
    for p in _files(source):
        h.update(p.name.encode() + b"\0" + bytes.fromhex(sha256_file(p)))
    return h.hexdigest()


def parse_story(text: str) -> tuple[list[str], list[str]]:
    """(article paragraphs, highlight sentences)."""
    article, highlights, next_is_highlight = [], [], False
    for line in text.splitlines():
        line = " ".join(line.split())
        if not line:
            continue
        if line.startswith("@highlight"):
            next_is_highlight = True
        elif next_is_highlight:
            highlights.append(line)
            next_is_highlight = False
        else:
            article.append(line)
    return article, highlights


def read(source: SourceConfig, name: str, unit: str, max_chars: int,
         part: int, parts: int) -> Iterator[R.RawDoc | R.Skip]:
    for i, path in enumerate(_files(source)):
        if i % parts != part:
            continue
        file = str(path)
        raw = path.read_bytes()
        if len(raw) > 4 * max_chars:
            yield R.Skip(R.TOO_LONG, file, 1, f"{len(raw)} bytes")
            continue
        text = R.decode(raw)
        if text is None:
            yield R.Skip(R.INVALID_UTF8, file, 1)
            continue
        reason = R.check_text(text, max_chars)
        if reason:
            yield R.Skip(reason, file, 1)
            continue
        article, highlights = parse_story(text)
        if not article:
            yield R.Skip(R.EMPTY, file, 1, "no article text")
        elif not highlights:
            yield R.Skip(R.MISSING_FIELD, file, 1, "no @highlight")
        else:
            yield R.RawDoc(f"{name}:{path.stem}", article, highlights, file, 1)
