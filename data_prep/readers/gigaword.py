"""English Gigaword in the LDC SGML layout (gzipped or not):

    <DOC id="AFP_ENG_19940512.0004" type="story" >
    <HEADLINE>...</HEADLINE>
    <DATELINE>...</DATELINE>
    <TEXT>
    <P>...</P>
    </TEXT>
    </DOC>

The file is scanned line by line in bytes; each DOC is decoded on its own so one bad document costs only
itself. Text outside any DOC (a truncated file's head) counts as one malformed record per run of lines.
"""
from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

from hibert.config.data import SourceConfig
from hibert.data_prep import records as R
from hibert.data_prep.readers.files import expand, file_units, open_binary, sha256_file

_DOC_START = re.compile(rb"^<DOC\b([^>]*)>")
_ATTR = re.compile(r'(\w+)\s*=\s*"([^"]*)"')
_HEADLINE = re.compile(r"<HEADLINE>(.*?)</HEADLINE>", re.S)
_TEXT = re.compile(r"<TEXT>(.*?)</TEXT>", re.S)
_P = re.compile(r"<P>(.*?)</P>", re.S)
_TAG = re.compile(r"</?[A-Za-z][^>]*>")


def list_units(source: SourceConfig) -> list[tuple[str, int]]:
    return file_units(expand(source.path))


def checksum(source: SourceConfig, unit: str) -> str:
    return sha256_file(Path(unit))


def _unescape(text: str) -> str:
    # LDC writes entities upper-case (&AMP;); html.unescape knows only the lower-case names.
    return html.unescape(re.sub(r"&(AMP|LT|GT|QUOT|APOS);", lambda m: f"&{m.group(1).lower()};", text))


def parse_doc(head: bytes, body: list[bytes], source: SourceConfig, name: str, unit: str, line: int,
              max_chars: int, too_long: bool) -> R.RawDoc | R.Skip:
    attrs = dict(_ATTR.findall(head.decode("latin-1")))
    if "id" not in attrs:
        return R.Skip(R.MALFORMED_SGML, unit, line, "DOC without id")
    if source.story_only and attrs.get("type", "story") != "story":
        return R.Skip(R.NON_STORY, unit, line, f"type={attrs.get('type')}")
    if too_long:
        return R.Skip(R.TOO_LONG, unit, line, attrs["id"])
    text = R.decode(b"".join(body))
    if text is None:
        return R.Skip(R.INVALID_UTF8, unit, line, attrs["id"])
    m = _TEXT.search(text)
    if m is None:
        return R.Skip(R.MALFORMED_SGML, unit, line, f"{attrs['id']}: no <TEXT>...</TEXT>")
    inner = m.group(1)
    if inner.count("<P>") != inner.count("</P>"):
        return R.Skip(R.MALFORMED_SGML, unit, line, f"{attrs['id']}: unbalanced <P>")
    blocks = _P.findall(inner) if "<P>" in inner else [inner]
    paragraphs = [p for b in blocks for p in R.split_paragraphs(_unescape(_TAG.sub(" ", b)))]
    reason = R.check_text("\n\n".join(paragraphs), max_chars)
    if reason:
        return R.Skip(reason, unit, line, attrs["id"])
    if source.include_title:
        h = _HEADLINE.search(text)
        title = " ".join(_unescape(_TAG.sub(" ", h.group(1))).split()) if h else ""
        if title:
            paragraphs = [title, *paragraphs]
    return R.RawDoc(f"{name}:{attrs['id']}", paragraphs, None, unit, line)


def read(source: SourceConfig, name: str, unit: str, max_chars: int,
         part: int, parts: int) -> Iterator[R.RawDoc | R.Skip]:
    ordinal = 0
    head: bytes | None = None        # the open DOC's start tag
    body: list[bytes] = []
    start = size = 0
    stray = 0                        # first line of a run of text outside any DOC
    limit = 4 * max_chars

    def emit(record: R.RawDoc | R.Skip) -> Iterator[R.RawDoc | R.Skip]:
        nonlocal ordinal
        if ordinal % parts == part:
            yield record
        ordinal += 1

    with open_binary(Path(unit)) as f:
        for lineno, raw in enumerate(f, 1):
            m = _DOC_START.match(raw)
            if m:
                if head is not None:
                    yield from emit(R.Skip(R.MALFORMED_SGML, unit, start, "<DOC> without </DOC>"))
                if stray:
                    yield from emit(R.Skip(R.MALFORMED_SGML, unit, stray, "text outside <DOC>"))
                    stray = 0
                head, body, start, size = m.group(1), [], lineno, 0
                continue
            if raw.startswith(b"</DOC>"):
                if head is None:
                    stray = stray or lineno
                    continue
                if ordinal % parts == part:
                    yield parse_doc(head, body, source, name, unit, start, max_chars, size > limit)
                ordinal += 1
                head = None
                continue
            if head is None:
                if raw.strip() and not stray:
                    stray = lineno
                continue
            size += len(raw)
            if size <= limit and ordinal % parts == part:  # keep memory bounded on a runaway DOC
                body.append(raw)
    if head is not None:
        yield from emit(R.Skip(R.MALFORMED_SGML, unit, start, "<DOC> without </DOC> at end of file"))
    if stray:
        yield from emit(R.Skip(R.MALFORMED_SGML, unit, stray, "text outside <DOC>"))
