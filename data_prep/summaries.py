"""Reference summaries in the shapes corpora ship them: separator-joined, glued, or plain text."""
from __future__ import annotations

import re

from hibert.config.data import SourceConfig
from hibert.data_prep.records import split_paragraphs

# Where a glued boundary may be: after a full stop (".The", '."The') or any other non-space character
# directly followed by an upper-case letter or a quote ("1.3%The", "RendezvousDirected", "staff,Vibe" —
# sentences the source cut without a full stop).
_GLUED_END = re.compile(r"[.!?]['\"\u2019\u201d)]?(?=\S)|(?<=[^\s])(?=[A-Z\"\u201c])")


def split_glued(summary: str, article: str) -> list[str]:
    """Restore the boundaries of sentences concatenated without a space (BBC News Summary).

    The summary's sentences are copied from the article, where whitespace surrounds each of them, while a
    span across a glued boundary never occurs there (the article has a space at that point). So from each
    boundary take the LONGEST candidate span that occurs in the article between whitespace; "3.5",
    "U.S.-led" or "TimeWarner" inside a sentence are thereby never cut.
    """
    art = " " + " ".join(article.split()) + " "
    summary = " ".join(summary.split())
    cands = sorted({p for m in _GLUED_END.finditer(summary) for p in (m.start() + 1, m.end())
                    if 0 < p < len(summary)} | {len(summary)})
    out, start = [], 0
    while start < len(summary):
        for p in reversed([c for c in cands if c > start]):
            piece = summary[start:p].strip()
            if piece and f" {piece} " in art:
                break
        else:  # not from the article: keep the rest whole rather than guess
            p = len(summary)
        piece = summary[start:p].strip()
        if piece:
            out.append(piece)
        start = p
    return out


def split_summary(summary: str, source: SourceConfig, article: str) -> list[str]:
    """Summary paragraphs (each is segmented further, so a paragraph may hold several sentences)."""
    if source.summary_sentence_sep:
        return [" ".join(x.split()) for x in summary.split(source.summary_sentence_sep) if x.strip()]
    if source.summary_glued:
        return split_glued(summary, article)
    return split_paragraphs(summary)
