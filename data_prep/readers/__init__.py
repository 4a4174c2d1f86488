"""Readers, one per corpus format. Each turns one input unit (a file, a collection of .story files, an HF
dataset split) into RawDoc / Skip records, counting every record exactly once.

`read(source, unit, max_chars, part, parts)` yields only the records whose ordinal (position in the unit)
satisfies `ordinal % parts == part`, so several shards can share a large file without coordination.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from hibert.config.data import SourceConfig
from hibert.data_prep.readers import cnndm, gigaword, hf, jsonl, multinews, text
from hibert.data_prep.records import RawDoc, Skip

_READERS = {"gigaword": gigaword, "cnndm": cnndm, "jsonl": jsonl, "hf": hf, "text": text, "multinews": multinews}


def source_name(source: SourceConfig, index: int) -> str:
    """Doc-id prefix of a source: its `name`, else the path's stem without glob characters."""
    if source.name:
        return source.name
    stem = Path(source.path.rstrip("/")).name.split(".")[0].strip("*?[]")
    return stem or f"{source.format}{index}"


def list_units(source: SourceConfig) -> list[tuple[str, int]]:
    """The (unit, size in bytes) pairs a source reads, in a fixed order."""
    units = _READERS[source.format].list_units(source)
    if not units:
        raise FileNotFoundError(f"data source {source.path!r} ({source.format}) matches no input")
    return units


def read(source: SourceConfig, name: str, unit: str, max_chars: int,
         part: int = 0, parts: int = 1) -> Iterator[RawDoc | Skip]:
    return _READERS[source.format].read(source, name, unit, max_chars, part, parts)


def checksum(source: SourceConfig, unit: str) -> str:
    """sha256 of the bytes behind a unit (a file; a set of .story files; an HF dataset's arrow files)."""
    return _READERS[source.format].checksum(source, unit)
