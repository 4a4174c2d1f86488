"""Raw input -> what a model reads: documents and clusters from text files, JSONL or stdin (refusing binary,
non-UTF-8 and empty input with a line naming the file), segmented and encoded exactly as the model's
training data was (segmenter kind and limits recorded in the export, its own tokenizer)."""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hibert.config.data import DataConfig, SegmenterConfig
from hibert.data_prep import tokenizer as tok
from hibert.data_prep.process import Sentencizer
from hibert.errors import UserError
from hibert.json_files import DAMAGED
from hibert.json_lines import INVALID_UTF8, NOT_OBJECT, TOO_LONG, BadLine, json_lines

_PTB_MARKERS = re.compile(r"(-lrb-|-rrb-| n't\b| 's\b| `` | '' )")


class InputError(ValueError):
    """Input we cannot summarize, with a message for the user (no stack trace)."""


@dataclass
class Summary:
    doc_id: str
    sentences: list[str]
    indices: list[int]
    num_sentences: int
    note: str = ""
    subwords: int | None = None   # abstractive: the summary's length in subwords ([SEP] counted, EOS not)

    def record(self, clusters: bool, model_note: str | None = None) -> dict:
        """What `hibert summarize --json` prints for it (also a corpus output line and a pyfunc output row);
        `model_note`: the model's own state ("cannot write yet"), ahead of this document's note."""
        rec: dict = {"id": self.doc_id, "summary": list(self.sentences)}
        if not clusters:
            rec["indices"] = [int(i) for i in self.indices]
        note = "; ".join(n for n in (model_note, self.note) if n)
        rec.update({"num_sentences": int(self.num_sentences), "note": note})
        if self.subwords is not None:
            rec["subwords"] = int(self.subwords)
        return rec


def looks_ptb(text: str) -> bool:
    """See et al.'s CNN/DM style: lowercased, PTB tokens (-lrb-, n't split off, `` '')."""
    return bool(_PTB_MARKERS.search(text)) and text == text.lower()


JSON_LINES = (".jsonl", ".ndjson", ".json")   # read as one JSON object per line, whatever the case (or + .gz)
DEFAULT_MAX_CHARS = 1_000_000                   # prep's default data.max_doc_chars
_UTF8_MAX = 4                                   # bytes per character at most (12 in JSON: a \uXXXX\uXXXX pair)


def is_json_lines(name: str) -> bool:
    p = Path(name)
    suffix = Path(p.stem).suffix if p.suffix.lower() == ".gz" else p.suffix
    return suffix.lower() in JSON_LINES


def read_documents(source: str, field: str, limit: int | None = None,
                   max_chars: int = DEFAULT_MAX_CHARS) -> Iterator[tuple[str, str]]:
    """(doc id, text) from a text file (one document), JSON Lines (one per line: .jsonl, .ndjson, .json, any
    case, plain or gzip, streamed) or '-' (stdin). A record that is not an object with a non-empty text `field`
    is an error naming its line (a cluster record, which holds a list of documents, says so). Nothing larger
    than `max_chars` characters (a document, a line) is read into memory whole."""
    if not is_json_lines(source):
        yield _read_text(source, max_chars)
        return
    for where, rec in _records(source, limit, max_chars):
        if isinstance(rec, dict) and isinstance(rec.get("documents"), list) and field not in rec:
            raise InputError(f"{where}: a cluster (a 'documents' list), but this model summarizes single "
                             "documents: use a multi-document (mds) model, or --field to name a text field")
        if not isinstance(rec, dict) or not isinstance(rec.get(field), str):
            raise InputError(f"{where}: no text field {field!r} (use --field)")
        if not rec[field].strip():
            raise InputError(f"{where}: field {field!r} is empty, nothing to summarize")
        _check_encodable(rec[field], where, field)
        yield where, rec[field]


def _check_encodable(text: str, where: str, field: str) -> None:
    """JSON can spell lone surrogates ("\\ud800"), which no segmenter or UTF-8 output can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{where}: field {field!r} holds a lone surrogate at character {e.start} (not "
                         "encodable as UTF-8): fix the record's escapes") from None


def _records(source: str, limit: int | None, max_chars: int) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """("name:line", object) of each non-blank line of a JSON Lines file, at most `limit`; an object's place
    holds None for a line that is JSON but not an object; a line that is not JSON, not UTF-8 or longer than a
    document may be is an error naming it; an input with no record at all is an error too."""
    from hibert.data_prep.readers.files import open_binary   # lazy: the plain-text path does not need it

    path = _input_file(source)
    max_bytes = 12 * max_chars
    n = 0
    with open_binary(path, max_bytes) as lines:
        for got in json_lines(lines, max_bytes=max_bytes):
            if isinstance(got, BadLine) and got.kind == TOO_LONG:
                raise InputError(f"{path.name}:{got.lineno}: a line over {max_bytes:,} bytes, above the "
                                 f"{max_chars:,} characters this model's training data allowed per document")
            if isinstance(got, BadLine) and got.kind == INVALID_UTF8:
                raise InputError(f"{path.name}:{got.lineno}: not UTF-8 text ({got.detail})")
            if isinstance(got, BadLine) and got.kind != NOT_OBJECT:
                raise InputError(f"{path.name}:{got.lineno}: invalid JSON ({got.detail})")
            n += 1
            yield (f"{path.name}:{got.lineno}", None) if isinstance(got, BadLine) else (f"{path.name}:{got[0]}", got[1])
            if limit and n >= limit:
                return
    if n == 0:
        raise InputError(f"{path.name}: empty input, nothing to summarize")


def _input_file(source: str) -> Path:
    path = Path(source)
    if not path.is_file():
        raise InputError(f"input {source!r} is not a file")
    return path


def _read_text(source: str, max_chars: int = DEFAULT_MAX_CHARS) -> tuple[str, str]:
    """(name, text) of a file or '-' (stdin), refusing binary, non-UTF-8, empty input and input longer than
    `max_chars` characters (read no further than that: /dev/zero or a sparse 4 GB file is not read whole)."""
    cap = _UTF8_MAX * max_chars
    if source == "-":
        raw = sys.stdin.buffer.read(cap + 1)
        name = "stdin"
    else:
        path = _input_file(source)
        with open(path, "rb") as f:
            raw = f.read(cap + 1)
        name = path.name
    if b"\x00" in raw[:8192]:
        raise InputError(f"{name}: looks like binary data, not text")
    if len(raw) > cap:
        raise InputError(f"{name}: over {cap:,} bytes, above the {max_chars:,} characters this model's training "
                         "data allowed per document (data.limits.max_doc_chars in its export.json): split it, or "
                         "summarize its first part")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise InputError(f"{name}: empty input, nothing to summarize")
    return name, text


def read_clusters(sources: list[str], field: str, limit: int | None = None,
                  max_chars: int = DEFAULT_MAX_CHARS) -> Iterator[tuple[str, list[str]]]:
    """(cluster id, document texts) for a multi-document model: several text files = one cluster (one
    document each); a .jsonl file (plain or gzip) = one cluster per line, its documents a list of strings in
    `field` (`documents` when the given field is the default 'text')."""
    if len(sources) == 1 and is_json_lines(sources[0]):
        key = "documents" if field == "text" else field
        for where, rec in _records(sources[0], limit, max_chars):
            docs = rec.get(key) if rec is not None else None
            if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
                raise InputError(f"{where}: no list of document strings in field {key!r} (use --field)")
            if not any(d.strip() for d in docs):
                raise InputError(f"{where}: every document of the cluster is empty")
            for d in docs:
                _check_encodable(d, where, key)
            yield where, docs
    else:
        texts = [_read_text(s, max_chars) for s in sources]
        name = texts[0][0] if len(texts) == 1 else f"{texts[0][0]}+{len(texts) - 1}"
        yield name, [t for _, t in texts]


LIMITS = {"max_sentence_tokens": 50, "max_doc_sentences": 30, "max_doc_chars": DEFAULT_MAX_CHARS}   # prep's defaults


def export_limits(export_dir: Path, meta: dict[str, Any] | None = None) -> dict[str, int]:
    """The data limits an export's training data was prepared with (export.json data.limits; prep's defaults
    where it records none): a value that is not a positive integer is one line naming the file and the key."""
    path = Path(export_dir) / "export.json"
    if meta is None:
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError):
            meta = {}
    data = meta.get("data") if isinstance(meta, dict) else None
    limits = data.get("limits") if isinstance(data, dict) else None
    if limits is None:
        return dict(LIMITS)
    if not isinstance(limits, dict):
        raise UserError(f"{path}: data.limits is {type(limits).__name__}, not a mapping of limits: {DAMAGED}")
    out = {}
    for key, default in LIMITS.items():
        v = limits.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"{path}: data.limits.{key} is {str(v)[:60]!r}, not a positive integer: {DAMAGED}")
        out[key] = v
    return out


def max_doc_chars(export_dir: Path) -> int:
    """The document limit an export's training data was prepared with (export.json data.limits)."""
    return export_limits(export_dir)["max_doc_chars"]


def check_length(text: str, where: str, limit: int) -> None:
    """The export's document limit, applied to summarize input as prep applied it to the training data."""
    if len(text) > limit:
        raise InputError(f"{where}: {len(text):,} characters, above the {limit:,} this model's training data "
                         "allowed (data.limits.max_doc_chars in its export.json): split the document, or summarize "
                         "its first part")


def check_lengths(inputs: list, export_dir: Path, clusters: bool) -> None:
    """Every input document within the export's max_doc_chars, checked before the model loads."""
    limit = max_doc_chars(export_dir)
    for name, body in inputs:
        for k, text in enumerate(body if clusters else [body]):
            check_length(text, f"{name} (document {k + 1})" if clusters else name, limit)


class TextEncoder:
    """Raw text -> encoded sentences exactly as the model's training data was made (segmenter kind and
    limits recorded in the export's `data` settings, its own tokenizer)."""
    def __init__(self, export_dir: Path, meta: dict, stanza_dir: str | None = None):
        data = meta.get("data", {})
        seg = data.get("segmenter", {})
        limits = export_limits(export_dir, meta)
        kind = seg.get("kind", "spacy") if isinstance(seg, dict) else seg
        if kind not in ("spacy", "neural"):
            raise UserError(f"{Path(export_dir) / 'export.json'}: data.segmenter.kind is {str(kind)[:60]!r}, not "
                            f"spacy or neural: {DAMAGED}")
        seg_cfg = SegmenterConfig(kind=kind, stanza_dir=stanza_dir)
        self.cfg = DataConfig(segmenter=seg_cfg, max_sentence_tokens=limits["max_sentence_tokens"],
                              max_doc_sentences=limits["max_doc_sentences"])
        self.max_doc_chars = limits["max_doc_chars"]
        self.sentencizer = Sentencizer(self.cfg)
        self.sp = tok.load(Path(export_dir) / "tokenizer.model")

    def paragraphs(self, text: str, name: str = "input") -> tuple[list[tuple[list[str], list[np.ndarray]]], bool]:
        """Per blank-line paragraph, its (sentence texts, subword ids) — empty sentences dropped — and PTB?"""
        check_length(text, name, self.max_doc_chars)
        ptb = looks_ptb(text)
        paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
        out = []
        for sents in self.sentencizer.sentences([([p], ptb) for p in paragraphs]):
            texts = [t for t, _ in sents if t.strip()]
            ids = [np.asarray(x[: self.cfg.max_sentence_tokens], dtype=np.int32)
                   for x in self.sp.encode(texts, out_type=int)] if texts else []
            keep = [i for i, x in enumerate(ids) if len(x)]
            if keep:
                out.append(([texts[i] for i in keep], [ids[i] for i in keep]))
        return out, ptb

    def __call__(self, text: str, name: str = "input") -> tuple[list[str], list[np.ndarray], bool]:
        """(sentence texts, their subword ids, read as PTB?) — empty sentences dropped."""
        check_length(text, name, self.max_doc_chars)
        ptb = looks_ptb(text)
        paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
        sents = [s for s in self.sentencizer.sentences([(paragraphs, ptb)])[0] if s[0].strip()]
        texts = [t for t, _ in sents]
        ids = [np.asarray(x[: self.cfg.max_sentence_tokens], dtype=np.int32)
               for x in self.sp.encode(texts, out_type=int)] if texts else []
        keep = [i for i, x in enumerate(ids) if len(x)]
        return [texts[i] for i in keep], [ids[i] for i in keep], ptb
