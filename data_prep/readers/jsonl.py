"""JSON Lines: one object a line; field names come from the source config."""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

from hibert import json_lines as JL
from hibert.config.data import SourceConfig
from hibert.data_prep import records as R
from hibert.data_prep.readers.fields import records_from_fields
from hibert.data_prep.readers.files import expand, file_units, open_binary, sha256_file


def list_units(source: SourceConfig) -> list[tuple[str, int]]:
    return file_units(expand(source.path, (".jsonl", ".json", ".jsonl.gz", ".json.gz")))


def checksum(source: SourceConfig, unit: str) -> str:
    return sha256_file(Path(unit))


# the one reader's bad lines (hibert/json_lines.py) as prep's counted skip reasons
_SKIPS = {JL.BLANK: R.EMPTY, JL.INVALID_UTF8: R.INVALID_UTF8, JL.MALFORMED_JSON: R.MALFORMED_JSON,
          JL.NOT_OBJECT: R.MALFORMED_JSON, JL.TOO_LONG: R.TOO_LONG}


def json_objects(unit: str, part: int, parts: int, max_bytes: int | None = None,
                 max_records: int | None = None) -> Iterator[tuple[int, dict] | R.Skip]:
    """(line number, object) for every line of this part of a JSON Lines file (the first `max_records` lines
    only); a bad line is a counted skip."""
    with open_binary(Path(unit), max_bytes) as f:
        lines = f if max_records is None else itertools.islice(f, max_records)
        for got in JL.json_lines(lines, part=part, parts=parts, max_bytes=max_bytes, blank_lines=True):
            if isinstance(got, JL.BadLine):
                yield R.Skip(_SKIPS[got.kind], unit, got.lineno, got.detail)
            else:
                yield got


def read(source: SourceConfig, name: str, unit: str, max_chars: int,
         part: int, parts: int) -> Iterator[R.RawDoc | R.Skip]:
    stem = Path(unit).name.split(".")[0]
    # a character is at most 12 bytes of JSON (a \uXXXX escaped surrogate pair): a longer line is too long for sure;
    # the decoded text's length is checked after parsing
    for got in json_objects(unit, part, parts, max_bytes=12 * max_chars, max_records=source.max_records):
        if isinstance(got, R.Skip):
            yield got
            continue
        line, obj = got
        yield from records_from_fields(obj, source, name, f"{stem}:{line}", unit, line, max_chars)
