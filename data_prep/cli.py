"""`hibert prep`: options and the entry point the `hibert` command calls."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from hibert.data_prep.dataset import MANIFEST, TOKENIZER
from hibert.data_prep.integrity import record, verify
from hibert.data_prep.merge import MissingShards
from hibert.data_prep.plan import PlanMismatch, write_json
from hibert.data_prep.segment import SegmenterUnavailable
from hibert.data_prep.shards import SPLITS
from hibert.data_prep.workers import WorkerDied
from hibert.errors import UserError

log = logging.getLogger("data_prep")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("prep")
    g.add_argument("--workers", type=int, default=None, help="worker processes (default: data.workers)")
    g.add_argument("--num-shards", type=int, default=None,
                   help="number of shards (Slurm array size); default: data.num_shards or from input size")
    g.add_argument("--shard-index", type=int, default=None,
                   help="process only this shard (a Slurm array task: $SLURM_ARRAY_TASK_ID); merge separately")
    g.add_argument("--merge", action="store_true", help="only merge finished shards into the dataset manifest")
    g.add_argument("--tokenizer-only", action="store_true",
                   help="only train (or install) the tokenizer, e.g. as the step before a Slurm array")
    g.add_argument("--stanza-dir", default=None,
                   help="stanza models dir (after stanza.download('en')): use stanza's neural tokenizer")
    g.add_argument("--fresh", action="store_true", help="ignore finished shards (and, locally, the tokenizer)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--verify", action="store_true",
                   help="check every file of the prepared dataset against its sha256 in the manifest, then exit")
    g.add_argument("--record-checksums", action="store_true",
                   help="a dataset prepared before checksums existed: record every file's size and sha256 as it "
                        "is now (opening and --verify check them from then on), then exit")


def verify_dataset(root: Path) -> int:
    """`hibert prep --verify`: every file rehashed (bit rot leaves sizes and mtimes alone)."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
        if not manifest.get("files"):
            print(f"hibert prep --verify: {root} records no checksums (prepared before they existed): `hibert prep "
                  f"--record-checksums data.dataset={root}` records them from the files as they are now, or prepare "
                  "it again", file=sys.stderr)
            return 2
        n = verify(root, manifest, full=True)
    except (OSError, ValueError) as e:  # UserError included: the damaged file, named
        print(f"hibert prep --verify: {e}", file=sys.stderr)
        return 1 if isinstance(e, UserError) else 2
    print(f"{root}: {n} files match their checksums")
    return 0


def record_checksums(root: Path) -> int:
    """`hibert prep --record-checksums`: the `files` merge would have written, for a dataset merged before
    checksums existed. It vouches for the files as they are now, not as prep wrote them (the manifest says so)."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
        if not isinstance(manifest, dict):
            raise ValueError(f"{root / MANIFEST} is not a dataset manifest (a JSON object)")
        if manifest.get("files"):
            print(f"{root} already records checksums: `hibert prep --verify` checks them")
            return 0
        manifest["files"] = record(root, tuple(s for s in SPLITS if (root / s).is_dir()), TOKENIZER)
        manifest["files_recorded"] = "after prep, from the files as they were then"
        write_json(root / MANIFEST, manifest)
    except (OSError, ValueError) as e:
        print(f"hibert prep --record-checksums: {e}", file=sys.stderr)
        return 2
    print(f"{root}: recorded the checksums of {len(manifest['files'])} files (shard tables counted once)")
    return 0


def run(cfg: Any, args: argparse.Namespace) -> int:
    # lazy: +~11 ms (filelock, tqdm) that every command would pay: `hibert --help` imports this module for its options
    from hibert.data_prep.pipeline import prepare

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    data = cfg.data
    if getattr(args, "verify", False):
        return verify_dataset(Path(data.dataset_dir))
    if getattr(args, "record_checksums", False):
        return record_checksums(Path(data.dataset_dir))
    if getattr(args, "stanza_dir", None):
        data.segmenter.kind = "neural"
        data.segmenter.stanza_dir = args.stanza_dir
    if getattr(args, "workers", None):
        data.workers = args.workers
    if args.shard_index is not None and args.num_shards is None and data.num_shards is None:
        print("hibert prep: --shard-index needs --num-shards (or data.num_shards) so every task agrees on the "
              "plan", file=sys.stderr)
        return 2
    try:
        manifest = prepare(data, workers=data.workers, num_shards=args.num_shards, shard_index=args.shard_index,
                           merge_only=args.merge, fresh=args.fresh, tokenizer_only=args.tokenizer_only,
                           progress=not args.no_progress)
    except (SegmenterUnavailable, PlanMismatch, MissingShards, FileNotFoundError, ValueError) as e:
        print(f"hibert prep: {e}", file=sys.stderr)
        return 2
    except WorkerDied as e:
        print(f"hibert prep: {e}", file=sys.stderr)
        return 1
    if manifest is not None:
        c = manifest["counts"]
        print(f"{data.output}: {c['docs_in']} docs in, {c['kept']} kept, skipped {c['skipped']}; "
              f"splits { {k: v['chunks'] for k, v in manifest['splits'].items()} } chunks")
    return 0
