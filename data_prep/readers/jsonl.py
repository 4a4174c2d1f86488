"""JSON Lines: one object a line; field names come from the source config."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from hibert.config.data import SourceConfig
from hibert.data_prep import records as R
from hibert.data_prep.readers.fields import record_from_fields
from hibert.data_prep.readers.files import expand, file_units, open_binary, sha256_file


def list_units(source: SourceConfig) -> list[tuple[str, int]]:
    return file_units(expand(source.path, (".jsonl", ".json", ".jsonl.gz", ".json.gz")))


def checksum(source: SourceConfig, unit: str) -> str:
    return sha256_file(Path(unit))


def json_objects(unit: str, part: int, parts: int,
                 max_bytes: int | None = None) -> Iterator[tuple[int, dict] | R.Skip]:
    """(line number, object) for every line of this part of a JSON Lines file; a bad line is a counted skip."""
    with open_binary(Path(unit), max_bytes) as f:
        for i, raw in enumerate(f):
            if i % parts != part:
                continue
            line = i + 1
            if max_bytes is not None and len(raw) > max_bytes:
                yield R.Skip(R.TOO_LONG, unit, line, f"over {max_bytes} bytes")
                continue
            text = R.decode(raw)
            if text is None:
                yield R.Skip(R.INVALID_UTF8, unit, line)
                continue
            if not text.strip():
                yield R.Skip(R.EMPTY, unit, line, "blank line")
                continue
            try:
                obj = json.loads(text)
            except (ValueError, RecursionError) as e:  # also nesting too deep, integers over Python's digit limit
                yield R.Skip(R.MALFORMED_JSON, unit, line, f"{type(e).__name__}: {str(e)[:150]}")
                continue
            if not isinstance(obj, dict):
                yield R.Skip(R.MALFORMED_JSON, unit, line, f"not an object but {type(obj).__name__}")
                continue
            yield line, obj


def read(source: SourceConfig, name: str, unit: str, max_chars: int,
         part: int, parts: int) -> Iterator[R.RawDoc | R.Skip]:
    stem = Path(unit).name.split(".")[0]
    # a character is at most 12 bytes of JSON (a \uXXXX escaped surrogate pair): a longer line is too long for sure;
    # the decoded text's length is checked after parsing
    for got in json_objects(unit, part, parts, max_bytes=12 * max_chars):
        if isinstance(got, R.Skip):
            yield got
            continue
        line, obj = got
        yield record_from_fields(obj, source, name, f"{stem}:{line}", unit, line, max_chars)
