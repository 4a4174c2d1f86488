"""What readers yield: a raw document or a skip with its reason, both tied to a file and line."""
from __future__ import annotations

import re
from dataclasses import dataclass

# Skip reasons counted in the manifest. Readers produce the first group; processing the rest.
INVALID_UTF8 = "invalid_utf8"
BINARY = "binary"
EMPTY = "empty"
TOO_LONG = "too_long"
MISSING_FIELD = "missing_field"
MALFORMED_JSON = "malformed_json"
MALFORMED_SGML = "malformed_sgml"
NON_STORY = "non_story"
NO_SENTENCES = "no_sentences"      # nothing left after segmentation / empty-sentence removal
DUPLICATE = "duplicate"
NOT_SAMPLED = "not_sampled"        # outside the source's sample_fraction (a subset asked for, not a fault)
MALFORMED_RELEVANT = "malformed_relevant"    # the source's relevant_field is not a list of document indices
NO_RELEVANT = "no_relevant_documents"        # relevant_field lists none of the cluster's documents


@dataclass
class RawDoc:
    """One document as read. Paragraphs are kept apart so no sentence spans a paragraph break."""
    doc_id: str
    paragraphs: list[str]
    summary: list[str] | None      # summary paragraphs (or sentences), None when the corpus has none
    file: str
    line: int
    split: str | None = None       # a split the input itself assigns (an HF DatasetDict's split)
    # clusters: the document (0-based, within the cluster) of each paragraph; None for a single document
    paragraph_doc: list[int] | None = None
    title: str | None = None
    synthetic: bool = False        # the record says it is a synthetic cluster
    not_relevant: int = 0          # clusters: documents the source's relevant_field dropped from this record


@dataclass
class Skip:
    reason: str
    file: str
    line: int
    detail: str = ""
    not_relevant: int = 0          # as RawDoc's: the record was skipped after its filter dropped these


_PARA_RE = re.compile(r"\n[ \t\r\f\v]*\n")
# Control characters other than tab/newline/carriage return; a real text has (almost) none.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


def decode(raw: bytes) -> str | None:
    """Strict UTF-8 (a BOM is dropped); None when the bytes are not UTF-8."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def looks_binary(text: str) -> bool:
    """NUL bytes or more than 1% control characters: binary garbage that happens to decode."""
    if "\x00" in text:
        return True
    n = len(_CONTROL_RE.findall(text[:100_000]))
    return n > max(2, len(text[:100_000]) // 100)


def split_paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, whitespace collapsed (single newlines are line wraps)."""
    out = []
    for p in _PARA_RE.split(text):
        p = " ".join(p.split())
        if p:
            out.append(p)
    return out


def check_text(text: str, max_chars: int) -> str | None:
    """The skip reason for a decoded document text, or None when it is usable."""
    if not text.strip():
        return EMPTY
    if len(text) > max_chars:
        return TOO_LONG
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, e.g. from a JSON "\\ud800" escape
        return INVALID_UTF8
    if looks_binary(text):
        return BINARY
    return None
