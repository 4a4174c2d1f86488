"""Multi-News (Fabbri et al. 2019): clusters of news articles with a human-written summary.

Two layouts: the original release — `<split>.src` / `<split>.tgt`, line-aligned, one cluster a line, the
source articles joined by `|||||` and newlines written as `NEWLINE_CHAR` — and JSON Lines (the HF
`multi_news` rows: `document` + `summary`; other field names through `text_field` / `summary_field`, e.g.
`documents_concat`). Document boundaries that were lost (one article holding everything) simply give a
one-document cluster; its paragraphs (or windows of sentences) are still the units."""
from __future__ import annotations

from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path

from hibert.config.data import SourceConfig
from hibert.data_prep import records as R
from hibert.data_prep.readers.fields import cluster_record
from hibert.data_prep.readers.files import expand, file_units, open_binary, sha256_file
from hibert.data_prep.readers.jsonl import json_objects
from hibert.errors import UserError

SEPARATOR = "|||||"
NEWLINE = "NEWLINE_CHAR"


def list_units(source: SourceConfig) -> list[tuple[str, int]]:
    return file_units(expand(source.path, (".src", ".src.gz", ".jsonl", ".jsonl.gz", ".json", ".json.gz")))


def _target(unit: str) -> Path:
    return Path(unit.replace(".src", ".tgt"))


def checksum(source: SourceConfig, unit: str) -> str:
    if ".src" in Path(unit).name:
        return sha256_file(Path(unit)) + ":" + sha256_file(_target(unit))
    return sha256_file(Path(unit))


def split_documents(text: str) -> list[str]:
    """The articles of a Multi-News source line: split at |||||, NEWLINE_CHAR back to newlines (a doubled
    one is a paragraph break)."""
    return [d.replace(NEWLINE, "\n").strip() for d in text.split(SEPARATOR)]


def _paragraphs_of(docs: list[str]) -> tuple[list[str], list[int]]:
    paragraphs: list[str] = []
    owner: list[int] = []
    for d in docs:
        ps = R.split_paragraphs(d.replace("\n", "\n\n") if "\n\n" not in d else d)
        if ps:
            paragraphs += ps
            owner += [owner[-1] + 1 if owner else 0] * len(ps)
    return paragraphs, owner


def _unpaired(src: Path, tgt: Path, n_src: int, n_tgt: int) -> UserError:
    return UserError(f"{src} has {n_src} lines but {tgt} has {n_tgt}: Multi-News .src/.tgt files pair line by "
                     "line (one cluster, one summary), so one of them is truncated or belongs to another split")


def read(source: SourceConfig, name: str, unit: str, max_chars: int,
         part: int, parts: int) -> Iterator[R.RawDoc | R.Skip]:
    path = Path(unit)
    stem = path.name.split(".")[0]
    if ".src" in path.name:
        tgt = _target(unit)
        if not tgt.is_file():
            raise FileNotFoundError(f"{unit}: Multi-News source without its summaries {tgt}")
        with open_binary(path) as src, open_binary(tgt) as ref:
            for i, (raw, raw_sum) in enumerate(zip_longest(src, ref)):
                if raw is None or raw_sum is None:   # the pairing is off: every cluster after it is suspect
                    raise _unpaired(path, tgt, i + (raw is not None) + sum(1 for _ in src),
                                    i + (raw_sum is not None) + sum(1 for _ in ref))
                if i % parts != part:
                    continue
                line = i + 1
                text, summary = R.decode(raw), R.decode(raw_sum)
                if text is None or summary is None:
                    yield R.Skip(R.INVALID_UTF8, unit, line)
                    continue
                obj = {"summary": summary.replace(NEWLINE, " ").strip()}
                paragraphs, owner = _paragraphs_of(split_documents(text))
                src_cfg = source.model_copy(update={"summary_field": "summary", "id_field": None, "title_field": None})
                yield cluster_record(paragraphs, owner, obj, src_cfg, name, f"{stem}:{line}", unit, line, max_chars)
        return
    field = source.text_field if source.text_field != "text" else "document"
    src_cfg = source if source.summary_field else source.model_copy(update={"summary_field": "summary"})
    for got in json_objects(unit, part, parts):
        if isinstance(got, R.Skip):
            yield got
            continue
        line, obj = got
        if not isinstance(obj.get(field), str):
            yield R.Skip(R.MISSING_FIELD, unit, line, f"no text {field!r}")
            continue
        paragraphs, owner = _paragraphs_of(split_documents(obj[field]))
        yield cluster_record(paragraphs, owner, obj, src_cfg, name, f"{stem}:{line}", unit, line, max_chars)
