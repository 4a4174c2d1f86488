"""`hibert export-hf EXPORT_OR_MODELS_URI OUT`: write the Hugging Face folder of an encoder export."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hibert.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="EXPORT_OR_MODELS_URI",
                   help="an export directory (run_dir/export) or a registered model: models:/NAME@ALIAS, "
                   "models:/NAME/VERSION (e.g. models:/hibert-encoder@in-domain)")
    p.add_argument("out", metavar="OUT", help="the Hugging Face folder to write (absent or empty; see --force)")
    p.add_argument("--encoder-only", action="store_true",
                   help="leave a finetuned extractive export's head out (the folder holds HibertModel only)")
    p.add_argument("--force", action="store_true", help="replace OUT when it is not empty")
    p.add_argument("--uri", default=None, help="tracking URI that resolves models:/ references (default: "
                   "$MLFLOW_TRACKING_URI or sqlite:///<output-dir>/mlflow.db)")
    p.add_argument("--output-dir", default="runs", help="where the default sqlite registry lives (default: runs)")


def run(args: argparse.Namespace) -> int:
    from hibert.hf_export.convert import export_hf    # lazy: torch, only when the command runs
    from hibert.redact import redact_uri
    from hibert.registry import resolve_model, tracking_uri

    try:
        local = resolve_model(args.source, tracking_uri(args.uri, args.output_dir, create=False))
    except (FileNotFoundError, UserError) as e:
        print(f"hibert export-hf: cannot load model {redact_uri(args.source)!r}: {e}", file=sys.stderr)
        return 2
    try:
        done = export_hf(local, Path(args.out), encoder_only=args.encoder_only,
                         force=args.force, source=args.source)
    except (FileNotFoundError, UserError, ValueError) as e:
        print(f"hibert export-hf: {e}", file=sys.stderr)
        return 1
    print(f"wrote {done.out}: {done.architecture} (task {done.task or 'unknown'}) from {local}")
    for note in done.notes:
        print(f"note: {note}")
    print(f"load:   AutoModel.from_pretrained({str(done.out)!r}, trust_remote_code=True)  (pip install "
          "'hibert-platform[hf]', or transformers + sentencepiece + safetensors)")
    print(f"upload: huggingface-cli upload YOUR_NAME/REPO {done.out} .")
    return 0
