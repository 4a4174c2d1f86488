"""Documents two prepared datasets share, by the content hash prep keeps of every source document
(`src_hash.npy`: the whitespace-normalized text, as exact-duplicate removal uses it): the check that no
validation or test article of a finetuning dataset entered a pretraining one.

    python -m hibert.data_prep.overlap PRETRAIN_DATASET [PRETRAIN_DATASET ...] --against DATASET [--splits valid,test]

prints one line per pretraining dataset and exits 1 when any shares a document with the given splits.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from hibert.data_prep.shards import SPLITS


def document_hashes(dataset: Path, splits: tuple[str, ...] = SPLITS) -> np.ndarray:
    """The content hashes of every source document in `splits` of a prepared dataset (sorted, unique)."""
    dataset = Path(dataset)
    if not (dataset / "manifest.json").is_file():
        raise FileNotFoundError(f"{dataset} is not a prepared dataset (no manifest.json)")
    parts = [np.load(p, allow_pickle=False) for s in splits for p in sorted((dataset / s).glob("shard-*/src_hash.npy"))]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)


def shared(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.intersect1d(a, b, assume_unique=True).size)


def overlap_report(pretraining: list[Path], against: Path, splits: tuple[str, ...]) -> dict:
    held_out = document_hashes(against, splits)
    rows = []
    for d in pretraining:
        mine = document_hashes(d)
        rows.append({"dataset": str(d), "documents": int(mine.size), "shared": shared(mine, held_out)})
    return {"against": str(against), "splits": list(splits), "held_out_documents": int(held_out.size),
            "pretraining": rows}


def report_lines(report: dict) -> list[str]:
    return [f"{r['dataset']}: {r['documents']:,} documents, {r['shared']} shared with the "
            f"{report['held_out_documents']:,} of {report['against']} {','.join(report['splits'])}"
            for r in report["pretraining"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hibert.data_prep.overlap", description=__doc__.splitlines()[0])
    p.add_argument("datasets", nargs="+", type=Path)
    p.add_argument("--against", required=True, type=Path)
    p.add_argument("--splits", default="valid,test")
    p.add_argument("--json", default=None, type=Path, help="also write the report here")
    args = p.parse_args(argv)
    try:
        report = overlap_report(args.datasets, args.against, tuple(args.splits.split(",")))
    except FileNotFoundError as e:
        print(f"overlap: {e}", file=sys.stderr)
        return 2
    print("\n".join(report_lines(report)))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if any(r["shared"] for r in report["pretraining"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
