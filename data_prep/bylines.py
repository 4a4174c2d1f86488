"""Byline and dateline lines removed from the head of a news article: a held-out set of clean articles.

The CNN/DM release (See et al.: lowercased, PTB-tokenized) keeps what preceded each article's text on the page:
Daily Mail bylines and time stamps ("by . jane doe . published : . 12:01 est , 3 may 2013 . | . updated : .
...") and photo captions. An extractive model evaluated on such articles is scored partly on whether it skips
them: Lead-3 there reads bylines, not the story. `strip_byline` removes the byline and time-stamp lines it
recognises (nothing else), so that a held-out set can be built the way a clean news article reads;
`python -m hibert.data_prep.bylines IN.jsonl OUT.jsonl` writes such a file and says how many records it
changed, kept as they were, or skipped (records in = changed + unchanged + skipped).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# "by . jane doe and john roe ." / "by . daily mail reporter ." (the name: a few words, no sentence inside)
_BY = re.compile(r"^by \. (?:[^.]{1,60}? \. ){1,2}?(?=(?:published|last updated|updated|pub|and|created)\b|\S)")
# the time stamps that follow it: "published : . 12:01 est , 3 may 2013 . | . updated : . 14:27 est , 3 may 2013 ."
# and "last updated at 7:37 am on 22nd june 2011 ."
_STAMP = re.compile(r"^(?:\| \. )?(?:published|updated|last updated|created)\s*(?::\s*\.|at)\s*[^.|]{0,60}?"
                    r"(?:\b\d{4}|\b(?:am|pm|est|gmt|bst))\s*\.\s*")
_SEP = re.compile(r"^\| \. ")
_FOLLOW = re.compile(r"^follow (?:@@ ?|@)\S+ \. ")   # "follow @@ janedoe_dm ." : the author's handle


def strip_byline(article: str) -> str:
    """`article` without the byline and time-stamp lines at its head (unchanged when it has none)."""
    text = article.strip()
    m = _BY.match(text)
    if m:
        text = text[m.end():].lstrip()
    # a stamp is "published : . <time or year> ." (or "last updated at ..."): "published figures show ..." is not
    for _ in range(4):   # "published : ... | . updated : ..." : a few stamps at most
        m = _STAMP.match(text) or _SEP.match(text) or _FOLLOW.match(text)
        if not m:
            break
        text = text[m.end():].lstrip()
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hibert.data_prep.bylines", description=__doc__.split("\n\n")[0])
    p.add_argument("input", type=Path, help="a JSON Lines file")
    p.add_argument("output", type=Path, help="the same records, `--field` without its byline lines")
    p.add_argument("--field", default="article", help="the article text field (default: article)")
    args = p.parse_args(argv)
    counts = {"changed": 0, "unchanged": 0, "skipped": 0}
    reasons: dict[str, int] = {}
    try:
        lines = args.input.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        print(f"bylines: cannot read {args.input}: {e}", file=sys.stderr)
        return 2
    out = []
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
            text = rec[args.field]
            if not isinstance(text, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            counts["skipped"] += 1
            key = f"not a JSON object with a string {args.field!r}"
            reasons[key] = reasons.get(key, 0) + 1
            continue
        clean = strip_byline(text)
        if not clean:
            counts["skipped"] += 1
            reasons["nothing left after the byline"] = reasons.get("nothing left after the byline", 0) + 1
            continue
        counts["changed" if clean != text.strip() else "unchanged"] += 1
        out.append(json.dumps({**rec, args.field: clean}, ensure_ascii=False))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(line + "\n" for line in out), encoding="utf-8")
    print(f"bylines: {len(lines)} records in {args.input}: {counts['changed']} changed, {counts['unchanged']} "
          f"unchanged, {counts['skipped']} skipped" + (f" ({reasons})" if reasons else "") + f" -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
