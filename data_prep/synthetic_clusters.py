"""SYNTHETIC multi-document clusters from a single-document news corpus (CNN/DM, BBC), for training and
experiments where real multi-document corpora (Multi-News, WikiSum, WCEP, DUC) cannot be had.

A cluster = one target article + its m nearest neighbours by tf-idf cosine among the articles of the same
split; its summary is the target article's own summary. Neighbours must be related (cosine >=
`min_similarity`) and not near-copies (< `max_similarity`); an article with no acceptable neighbour is
skipped and counted (`no_related_articles`) — unrelated articles are never grouped. Document order inside a
cluster is shuffled per cluster (seeded) so the target is not always first; `target_doc` says where it is.
Every record carries `"synthetic": true`, and the stats file says what these clusters are and are not.

tf-idf: the platform's one (hibert/tfidf.py: lower-cased [a-z0-9] words, sublinear tf, smoothed idf, rows
L2-normalised), as a scipy sparse matrix; the
neighbour search multiplies blocks of 2,048 rows by the transposed matrix (work ~ nnz per row x rows sharing
terms, memory one dense block row at a time) and keeps the top m by argpartition.

    python -m hibert.data_prep.synthetic_clusters --input cnndm_train.jsonl --output clusters.jsonl \\
        --text-field article --summary-field highlights --id-field idx --split-field split --neighbours 3
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from hibert import json_lines as JL
from hibert.data_prep.readers.files import open_binary
from hibert.tfidf import sparse_matrix

EXAMPLES = 5
DESCRIPTION = ("SYNTHETIC clusters built from single-document news articles: each article with its tf-idf "
               "nearest neighbours from the same split; the summary is the article's own. Not real "
               "multi-document topics.")


def neighbours(mat, m: int, min_similarity: float, max_similarity: float,
               block: int = 2048) -> list[list[tuple[int, float]]]:
    """Per row, up to m (row, cosine) pairs with min_similarity <= cosine < max_similarity, best first."""
    out: list[list[tuple[int, float]]] = []
    t = mat.T.tocsc()
    for start in range(0, mat.shape[0], block):
        sims = (mat[start:start + block] @ t).toarray()
        for k, row in enumerate(sims):
            i = start + k
            row[i] = -1.0
            row[(row < min_similarity) | (row >= max_similarity)] = -1.0
            cand = np.argpartition(-row, min(m, len(row) - 1))[:m] if len(row) > m else np.arange(len(row))
            cand = cand[np.argsort(-row[cand], kind="stable")]
            out.append([(int(j), float(row[j])) for j in cand if row[j] >= min_similarity])
    return out


def build_clusters(records: list[dict[str, Any]], text_field: str, summary_field: str, id_field: str | None,
                   split_field: str | None, m: int = 3, min_similarity: float = 0.1, max_similarity: float = 0.9,
                   seed: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(clusters, stats) from well-formed records (see `read_records` for the checks)."""
    pools: dict[Any, list[int]] = {}
    for i, r in enumerate(records):
        pools.setdefault(r.get(split_field) if split_field else None, []).append(i)
    clusters: list[dict[str, Any]] = []
    sizes: Counter = Counter()
    skipped = 0
    sims_all: list[float] = []
    for split, idx in pools.items():
        mat = sparse_matrix([records[i][text_field] for i in idx])
        for k, nb in enumerate(neighbours(mat, m, min_similarity, max_similarity)):
            i = idx[k]
            if not nb:
                skipped += 1
                continue
            members = [(i, 1.0)] + [(idx[j], s) for j, s in nb]
            rng = np.random.default_rng([seed, i])
            order = rng.permutation(len(members)).tolist()
            members = [members[o] for o in order]
            rid = records[i].get(id_field) if id_field else i
            clusters.append({
                "id": str(rid), "documents": [records[j][text_field] for j, _ in members],
                "summary": records[i][summary_field], "synthetic": True, "target_doc": order.index(0),
                "document_ids": [str(records[j].get(id_field) if id_field else j) for j, _ in members],
                "similarity": [round(s, 4) for _, s in members], "split": split})
            sizes[len(nb)] += 1
            sims_all += [s for _, s in nb]
    stats = {"clusters": len(clusters), "skipped": {"no_related_articles": skipped} if skipped else {},
             "neighbours_histogram": {str(k): v for k, v in sorted(sizes.items())},
             "mean_neighbour_similarity": round(float(np.mean(sims_all)), 4) if sims_all else None}
    return clusters, stats


def _encodable(value: Any) -> bool:
    """False for strings with lone surrogates (a JSON "\\ud800" escape): they cannot be written as UTF-8."""
    try:
        str(value).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# the one reader's bad lines (hibert/json_lines.py) as this builder's skip reasons
_SKIPS = {JL.BLANK: "empty", JL.INVALID_UTF8: "invalid_utf8", JL.MALFORMED_JSON: "malformed_json",
          JL.NOT_OBJECT: "missing_field"}


def _check(rec: dict[str, Any], text_field: str, summary_field: str, split_field: str | None,
           id_field: str | None) -> dict[str, Any] | str:
    """The record of a JSONL object, or why it is skipped."""
    if not isinstance(rec.get(text_field), str) or not isinstance(rec.get(summary_field), str):
        return "missing_field"
    if split_field and not isinstance(rec.get(split_field), (str, int, type(None))):
        return "missing_field"    # a split is a name or a number; a list or object cannot group records
    if id_field and isinstance(rec.get(id_field), (dict, list)):
        return "missing_field"
    used = (rec[text_field], rec[summary_field], rec.get(split_field or ""), rec.get(id_field or ""))
    if not all(_encodable(v) for v in used):
        return "invalid_utf8"
    if not rec[text_field].strip() or not rec[summary_field].strip():
        return "empty"
    return rec


def read_records(paths: Iterable[str], text_field: str, summary_field: str, split_field: str | None = None,
                 id_field: str | None = None) -> tuple[list[dict], Counter, dict]:
    """Well-formed records of JSONL files; bad lines are counted with their file:line (first 5 per reason)."""
    records: list[dict] = []
    skipped: Counter = Counter()
    examples: dict[str, list[str]] = {}

    def skip(reason: str, where: str) -> None:
        skipped[reason] += 1
        if len(examples.setdefault(reason, [])) < EXAMPLES:
            examples[reason].append(where)

    for path in paths:
        with open_binary(Path(path)) as f:   # plain or gzip JSON Lines, streamed
            for got in JL.json_lines(f, blank_lines=True):
                if isinstance(got, JL.BadLine):
                    skip(_SKIPS[got.kind], f"{path}:{got.lineno}")
                    continue
                n, rec = got
                reason = _check(rec, text_field, summary_field, split_field, id_field)
                if isinstance(reason, str):
                    skip(reason, f"{path}:{n}")
                else:
                    records.append(reason)
    return records, skipped, examples


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", action="append", required=True, help="JSONL file of articles (repeatable)")
    p.add_argument("--output", required=True, help="JSONL clusters to write (stats next to it: .stats.json)")
    p.add_argument("--text-field", default="article")
    p.add_argument("--summary-field", default="highlights")
    p.add_argument("--id-field", default=None)
    p.add_argument("--split-field", default=None, help="neighbours only within the same value of this field")
    p.add_argument("--neighbours", type=int, default=3, help="other articles per cluster (m)")
    p.add_argument("--min-similarity", type=float, default=0.1)
    p.add_argument("--max-similarity", type=float, default=0.9, help="near-duplicates are not neighbours")
    p.add_argument("--seed", type=int, default=0)


def input_problem(path: str) -> str | None:
    """Why `path` cannot be a JSON Lines input (missing, a directory, unreadable, binary), or None. A binary
    file would otherwise be read as hundreds of bad lines and end in "0 clusters", exit 0."""
    p = Path(path)
    if p.is_dir():
        return f"--input {path} is a directory: name a JSONL file"
    try:
        with open(p, "rb") as f:
            head = f.read(65536)
        if head[:2] == b"\x1f\x8b":   # gzip JSON Lines: the text inside is what must not be binary
            with gzip.open(p, "rb") as f:
                head = f.read(65536)
    except OSError as e:   # gzip.BadGzipFile included
        return f"--input {path}: cannot be read ({getattr(e, 'strerror', None) or e})"
    except EOFError:
        return f"--input {path}: damaged gzip data (truncated)"
    if b"\0" in head:
        return f"--input {path} is a binary file (NUL bytes), not JSON lines"
    return None


def run(args: argparse.Namespace) -> int:
    t0 = time.time()
    out = Path(args.output)
    for path in args.input:
        if (problem := input_problem(path)) is not None:
            print(f"hibert synth-clusters: {problem}", file=sys.stderr)
            return 2
        for written in (out, Path(str(out) + ".stats.json")):
            if written.resolve() == Path(path).resolve():   # opened for writing, it would be emptied first
                print(f"hibert synth-clusters: --output {args.output} would overwrite --input {path} (it writes "
                      f"{written}); name another file", file=sys.stderr)
                return 2
    records, bad, examples = read_records(args.input, args.text_field, args.summary_field, args.split_field,
                                          args.id_field)
    if not records:   # nothing to cluster: an output of 0 clusters would look like a result
        print(f"hibert synth-clusters: --input {', '.join(args.input)} holds no usable record (skipped "
              f"{dict(bad)}; first: {next(iter(examples.values()), ['-'])[0]}): JSON lines with the text field "
              f"{args.text_field!r} and the summary field {args.summary_field!r} are needed", file=sys.stderr)
        return 2
    clusters, stats = build_clusters(records, args.text_field, args.summary_field, args.id_field, args.split_field,
                                     args.neighbours, args.min_similarity, args.max_similarity, args.seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for c in clusters:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    skipped = {**dict(bad), **stats.pop("skipped")}
    records_in = len(records) + sum(bad.values())
    summary = {"synthetic": True, "description": DESCRIPTION, "records_in": records_in, "written": len(clusters),
               "skipped": skipped, "skip_examples": examples, **stats,
               "settings": {k: getattr(args, k) for k in ("input", "text_field", "summary_field", "id_field",
                                                          "split_field", "neighbours", "min_similarity",
                                                          "max_similarity", "seed")},
               "seconds": round(time.time() - t0, 2)}
    assert records_in == len(clusters) + sum(skipped.values())
    Path(str(out) + ".stats.json").write_text(json.dumps(summary, indent=1))
    print(f"{out}: {len(clusters)} SYNTHETIC clusters from {records_in} records, skipped {skipped} "
          f"({summary['seconds']} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hibert.data_prep.synthetic_clusters", description=DESCRIPTION)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
