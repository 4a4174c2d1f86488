"""Penn-Treebank-tokenized text (See et al.'s CNN/DM: lowercased, `-lrb-`, ``` `` ```, `could n't`).

Sentence boundaries are exact in this format: a sentence-final `.`/`!`/`?` is its own token while
abbreviations keep their dot (`no.`, `u.s.`), so splitting at those tokens beats re-segmenting lowercased
text (a rule-based segmenter cuts "world no. 5" in two). Each sentence is then detokenized for reading.
"""
from __future__ import annotations

import re

_FINAL = {".", "!", "?"}
_CLOSERS = {"''", "'", "-rrb-", "-rsb-", ")", "]", '"'}
_BRACKETS = {"-lrb-": "(", "-rrb-": ")", "-lsb-": "[", "-rsb-": "]", "-lcb-": "{", "-rcb-": "}"}
_CLITICS = re.compile(r" (n't|'s|'re|'ve|'ll|'d|'m|')(?=\s|$)", re.I)
_NO_SPACE_BEFORE = re.compile(r" ([.,;:!?%)\]}]|\.\.\.)")
_NO_SPACE_AFTER = re.compile(r"([(\[{$#]) ")


def split_sentences(text: str) -> list[list[str]]:
    """Token lists, cut after a final punctuation token (and any closing quote/bracket after it)."""
    sentences, current = [], []
    tokens = text.split()
    for i, tok in enumerate(tokens):
        current.append(tok)
        if tok in _FINAL or (tok in _CLOSERS and len(current) > 1 and current[-2] in _FINAL):
            if i + 1 < len(tokens) and tokens[i + 1] in _CLOSERS:
                continue  # the closer belongs to this sentence
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


def detokenize(tokens: list[str]) -> str:
    """Readable text: brackets and quotes restored, clitics and punctuation attached."""
    # `` opens a quote (glued to the next token), '' closes one (glued to the previous token)
    marks = {"``": '"\u0001', "''": '\u0002"'}
    text = " ".join(marks.get(t, _BRACKETS.get(t, t)) for t in tokens)
    text = text.replace("\u0001 ", "").replace("\u0001", "").replace(" \u0002", "").replace("\u0002", "")
    text = _CLITICS.sub(r"\1", text)
    text = _NO_SPACE_BEFORE.sub(r"\1", text)
    return _NO_SPACE_AFTER.sub(r"\1", text)
