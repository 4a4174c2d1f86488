"""Turn a mapping (a JSON object or an HF row) into a RawDoc using the source's field names."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

from hibert.config.data import SourceConfig
from hibert.data_prep import records as R
from hibert.data_prep.summaries import split_summary


def _paragraphs(value: Any) -> list[str] | None:
    """A string (blank lines separate paragraphs) or a list of strings (one paragraph each)."""
    if isinstance(value, str):
        return R.split_paragraphs(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return [p for v in value for p in R.split_paragraphs(v)]
    return None


def _raw_text(value: Any) -> str:
    return value if isinstance(value, str) else "\n\n".join(value)


def _summary(obj: Mapping[str, Any], source: SourceConfig, raw: str, file: str, line: int,
             max_chars: int) -> list[str] | None | R.Skip:
    """The record's summary (None when the source has none), or why the record is skipped."""
    if not source.summary_field:
        return None
    svalue = obj.get(source.summary_field)
    if svalue is None or _paragraphs(svalue) is None:
        return R.Skip(R.MISSING_FIELD, file, line, f"no usable {source.summary_field!r}")
    sraw = _raw_text(svalue)
    reason = R.check_text(sraw, max_chars)
    if reason:
        return R.Skip(reason, file, line, "in the summary")
    return split_summary(sraw, source, raw)


def _encodable(text: str) -> bool:
    """False for lone surrogates (a JSON "\\ud800" escape): text that cannot be written as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _title(obj: Mapping[str, Any], source: SourceConfig, file: str, line: int) -> str | None | R.Skip:
    """The record's title, whitespace collapsed (None when it has none)."""
    title = obj.get(source.title_field) if source.title_field else None
    if not isinstance(title, str) or not title.strip():
        return None
    if not _encodable(title):
        return R.Skip(R.INVALID_UTF8, file, line, f"in the title {source.title_field!r}")
    return " ".join(title.split())


def _doc_id(obj: Mapping[str, Any], source: SourceConfig, default_id: str, file: str, line: int) -> str | R.Skip:
    if not source.id_field:
        return default_id
    native = obj.get(source.id_field)
    if native is None or isinstance(native, (dict, list)):
        return R.Skip(R.MISSING_FIELD, file, line, f"no usable {source.id_field!r}")
    if not _encodable(str(native)):
        return R.Skip(R.INVALID_UTF8, file, line, f"in the id {source.id_field!r}")
    return str(native)


def cluster_paragraphs(documents: list[Any]) -> tuple[list[str], list[int]] | None:
    """A cluster's documents (strings, or lists of paragraph strings) -> (paragraphs, document of each);
    empty documents are dropped and the rest renumbered. None when the value is not a list of documents."""
    paragraphs: list[str] = []
    owner: list[int] = []
    for d in documents:
        ps = _paragraphs(d)
        if ps is None:
            return None
        if ps:
            paragraphs += ps
            owner += [owner[-1] + 1 if owner else 0] * len(ps)
    return paragraphs, owner


def record_from_fields(obj: Mapping[str, Any], source: SourceConfig, name: str, default_id: str,
                       file: str, line: int, max_chars: int) -> R.RawDoc | R.Skip:
    if source.documents_field:
        return _cluster_from_fields(obj, source, name, default_id, file, line, max_chars)
    value = obj.get(source.text_field)
    if value is None:
        return R.Skip(R.MISSING_FIELD, file, line, f"no {source.text_field!r}")
    paragraphs = _paragraphs(value)
    if paragraphs is None:
        return R.Skip(R.MISSING_FIELD, file, line, f"{source.text_field!r} is {type(value).__name__}, not text")
    raw = _raw_text(value)
    reason = R.check_text(raw, max_chars)
    if reason:
        return R.Skip(reason, file, line)
    summary = _summary(obj, source, raw, file, line, max_chars)
    if isinstance(summary, R.Skip):
        return summary
    if source.include_title:
        title = _title(obj, source, file, line)
        if isinstance(title, R.Skip):
            return title
        if title:
            paragraphs = [title, *paragraphs]
    doc_id = _doc_id(obj, source, default_id, file, line)
    if isinstance(doc_id, R.Skip):
        return doc_id
    return R.RawDoc(f"{name}:{doc_id}", paragraphs, summary, file, line)


def relevant_documents(obj: Mapping[str, Any], source: SourceConfig, docs: list[Any], file: str,
                       line: int) -> list[Any] | R.Skip:
    """The documents that the record's `relevant_field` keeps — a list of distinct 0-based indices into its
    documents — in document order; a list that is anything else is a counted skip."""
    field, value, n = source.relevant_field, obj.get(source.relevant_field), len(docs)
    if not isinstance(value, list):
        return R.Skip(R.MALFORMED_RELEVANT, file, line, f"{field!r} is {type(value).__name__}, not a list of "
                      "document indices")
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n]
    if bad:
        return R.Skip(R.MALFORMED_RELEVANT, file, line, f"{field!r} holds {bad[0]!r}: not an index of the "
                      f"record's {n} documents")
    if len(set(value)) != len(value):
        return R.Skip(R.MALFORMED_RELEVANT, file, line, f"{field!r} lists a document twice: {value}")
    keep = set(value)
    return [d for k, d in enumerate(docs) if k in keep]


def _cluster_from_fields(obj: Mapping[str, Any], source: SourceConfig, name: str, default_id: str,
                         file: str, line: int, max_chars: int) -> R.RawDoc | R.Skip:
    """A cluster record: `documents_field` holds its documents (with `relevant_field`, only the ones it lists);
    summary, id and title as for documents."""
    docs = obj.get(source.documents_field)
    if not isinstance(docs, list):
        return R.Skip(R.MISSING_FIELD, file, line, f"no list {source.documents_field!r}")
    dropped = 0
    if source.relevant_field:
        kept = relevant_documents(obj, source, docs, file, line)
        if isinstance(kept, R.Skip):
            return kept
        dropped = len(docs) - len(kept)
        if not kept:
            return R.Skip(R.NO_RELEVANT, file, line, f"{source.relevant_field!r} is empty", not_relevant=dropped)
        docs = kept
    got = cluster_paragraphs(docs)
    if got is None:
        return R.Skip(R.MISSING_FIELD, file, line, f"{source.documents_field!r} holds something other than text",
                      not_relevant=dropped)
    rec = cluster_record(*got, obj, source, name, default_id, file, line, max_chars)
    rec.not_relevant = dropped   # counted whatever becomes of the cluster: the filter's own tally
    return rec


def cluster_record(paragraphs: list[str], owner: list[int], obj: Mapping[str, Any], source: SourceConfig,
                   name: str, default_id: str, file: str, line: int, max_chars: int) -> R.RawDoc | R.Skip:
    raw = "\n\n".join(paragraphs)
    reason = R.check_text(raw, max_chars)
    if reason:
        return R.Skip(reason, file, line, "cluster")
    summary = _summary(obj, source, raw, file, line, max_chars)
    if isinstance(summary, R.Skip):
        return summary
    doc_id = _doc_id(obj, source, default_id, file, line)
    if isinstance(doc_id, R.Skip):
        return doc_id
    title = _title(obj, source, file, line)
    if isinstance(title, R.Skip):
        return title
    return R.RawDoc(f"{name}:{doc_id}", paragraphs, summary, file, line, paragraph_doc=owner, title=title,
                    synthetic=bool(obj.get("synthetic") is True))


def sampled(source: SourceConfig, record_id: str) -> bool:
    """Whether a record is in the source's `sample_fraction`: a hash of (sample_seed, id), so the subset is
    the same whatever the sharding and nested (a smaller fraction's records are in a larger one's)."""
    if source.sample_fraction is None:
        return True
    h = hashlib.sha256(f"{source.sample_seed}:{record_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < source.sample_fraction


def _split_documents(obj: Mapping[str, Any], source: SourceConfig, name: str, default_id: str,
                     file: str, line: int, max_chars: int) -> Iterator[R.RawDoc | R.Skip]:
    """Each document of a cluster record as a document of its own (`split_documents`): one RawDoc or Skip each."""
    docs = obj.get(source.documents_field)
    if not isinstance(docs, list) or not docs:
        yield R.Skip(R.MISSING_FIELD, file, line, f"no list {source.documents_field!r}")
        return
    record_id = _doc_id(obj, source, default_id, file, line)
    if isinstance(record_id, R.Skip):
        yield record_id
        return
    for k, d in enumerate(docs):
        paragraphs = _paragraphs(d)
        if paragraphs is None:
            yield R.Skip(R.MISSING_FIELD, file, line, f"{source.documents_field!r}[{k}] is not text")
            continue
        reason = R.check_text(_raw_text(d), max_chars)
        if reason:
            yield R.Skip(reason, file, line, f"document {k}")
            continue
        yield R.RawDoc(f"{name}:{record_id}/{k}", paragraphs, None, file, line)


def records_from_fields(obj: Mapping[str, Any], source: SourceConfig, name: str, default_id: str,
                        file: str, line: int, max_chars: int) -> Iterator[R.RawDoc | R.Skip]:
    """What one record gives: a document or cluster (or its skip), each document of it with
    `split_documents`, or a NOT_SAMPLED skip outside the source's `sample_fraction`."""
    if source.sample_fraction is not None:
        rid = _doc_id(obj, source, default_id, file, line)
        if not isinstance(rid, R.Skip) and not sampled(source, rid):
            yield R.Skip(R.NOT_SAMPLED, file, line, rid)
            return
    if source.split_documents:
        yield from _split_documents(obj, source, name, default_id, file, line, max_chars)
    else:
        yield record_from_fields(obj, source, name, default_id, file, line, max_chars)
