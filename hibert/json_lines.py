"""The one JSON Lines reader of the project. Corpora for prep (data_prep/readers/jsonl.py), the SYNTHETIC
cluster builder (data_prep/synthetic_clusters.py), `hibert summarize` input (finetune/inference/text.py) and
corpus summarize (finetune/inference/source.py) read their lines through `json_lines`: what a bad line is
(not UTF-8, not JSON, not an object, too long) is decided here once; what a caller does with one — an error
naming the line, or a skip it counts — is its own."""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

BLANK, INVALID_UTF8, MALFORMED_JSON, NOT_OBJECT, TOO_LONG = (
    "blank", "invalid_utf8", "malformed_json", "not_object", "too_long")


@dataclass(frozen=True)
class BadLine:
    lineno: int        # 1-based
    kind: str          # one of the kinds above
    detail: str = ""   # e.g. the JSON parser's message


def json_lines(lines: Iterable[bytes | str], *, part: int = 0, parts: int = 1, after: int = 0,
               max_bytes: int | None = None, blank_lines: bool = False) -> Iterator[tuple[int, dict[str, Any]] | BadLine]:
    """(line number, object) for each line of `lines` (a binary file, or decoded lines) that part `part` of
    `parts` owns (line i, 0-based, belongs to part i mod parts) past line number `after` (lines up to it are
    not parsed: a resume); a line that is not a JSON object comes as a `BadLine`. Bytes are strict UTF-8 (a
    BOM dropped). Blank lines are passed over, or come as BadLine(BLANK) with `blank_lines`."""
    for i, raw in enumerate(lines):
        lineno = i + 1
        if i % parts != part or lineno <= after:
            continue
        if max_bytes is not None and len(raw) > max_bytes:
            yield BadLine(lineno, TOO_LONG, f"over {max_bytes} bytes")
            continue
        if isinstance(raw, bytes):
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError as e:
                yield BadLine(lineno, INVALID_UTF8, f"{e.reason} at byte {e.start}")
                continue
        else:
            text = raw
        if not text.strip():
            if blank_lines:
                yield BadLine(lineno, BLANK, "blank line")
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            yield BadLine(lineno, MALFORMED_JSON, e.msg)
            continue
        except RecursionError:
            yield BadLine(lineno, MALFORMED_JSON, "nested too deeply")
            continue
        except ValueError as e:   # an integer past Python's digit limit, ...
            yield BadLine(lineno, MALFORMED_JSON, str(e)[:150])
            continue
        if not isinstance(obj, dict):
            yield BadLine(lineno, NOT_OBJECT, f"a JSON {type(obj).__name__}")
            continue
        yield lineno, obj
