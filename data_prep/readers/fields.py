"""Turn a mapping (a JSON object or an HF row) into a RawDoc using the source's field names."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hibert.config.data import SourceConfig

from data_prep import records as R
from data_prep.summaries import split_summary


def _paragraphs(value: Any) -> list[str] | None:
    """A string (blank lines separate paragraphs) or a list of strings (one paragraph each)."""
    if isinstance(value, str):
        return R.split_paragraphs(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return [p for v in value for p in R.split_paragraphs(v)]
    return None


def _raw_text(value: Any) -> str:
    return value if isinstance(value, str) else "\n\n".join(value)


def record_from_fields(obj: Mapping[str, Any], source: SourceConfig, name: str, default_id: str,
                       file: str, line: int, max_chars: int) -> R.RawDoc | R.Skip:
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
    summary = None
    if source.summary_field:
        svalue = obj.get(source.summary_field)
        if svalue is None or _paragraphs(svalue) is None:
            return R.Skip(R.MISSING_FIELD, file, line, f"no usable {source.summary_field!r}")
        sraw = _raw_text(svalue)
        reason = R.check_text(sraw, max_chars)
        if reason:
            return R.Skip(reason, file, line, "in the summary")
        summary = split_summary(sraw, source, raw)
    if source.include_title and source.title_field:
        title = obj.get(source.title_field)
        if isinstance(title, str) and title.strip():
            paragraphs = [" ".join(title.split()), *paragraphs]
    doc_id = default_id
    if source.id_field:
        native = obj.get(source.id_field)
        if native is None or isinstance(native, (dict, list)):
            return R.Skip(R.MISSING_FIELD, file, line, f"no usable {source.id_field!r}")
        doc_id = str(native)
    return R.RawDoc(f"{name}:{doc_id}", paragraphs, summary, file, line)
