"""`hibert registry list|show` — what is in the MLflow model registry."""
from __future__ import annotations

import argparse
import json
import sys

from hibert.registry import list_versions, tracking_uri


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "show"], help="list: every registered version; "
                   "show: one model's versions with tags (needs --name or NAME@ALIAS)")
    p.add_argument("target", nargs="?", default=None, help="model name, or name@alias / name/version for show")
    p.add_argument("--uri", default=None, help="tracking URI (default: $MLFLOW_TRACKING_URI or "
                   "sqlite:///<output-dir>/mlflow.db)")
    p.add_argument("--output-dir", default="runs", help="where the default sqlite registry lives")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    uri = tracking_uri(args.uri, args.output_dir)
    name, alias, version = args.target, None, None
    if name and "@" in name:
        name, alias = name.split("@", 1)
    elif name and "/" in name:
        name, version = name.split("/", 1)
    if args.action == "show" and not name:
        print("hibert registry show: give a model name, e.g. hibert-encoder@in-domain", file=sys.stderr)
        return 2
    try:
        rows = list_versions(uri, name)
    except Exception as e:  # mlflow raises its own exception types for unknown models
        print(f"hibert registry: {e}", file=sys.stderr)
        return 1
    if alias:
        rows = [r for r in rows if alias in r["aliases"]]
    if version:
        rows = [r for r in rows if r["version"] == version]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no registered models at {uri}")
        return 0
    for r in rows:
        aliases = ",".join(r["aliases"]) or "-"
        print(f"{r['name']:<22} v{r['version']:<4} aliases={aliases:<22} run={r['run_id']}")
        if args.action == "show":
            print(f"    source: {r['source']}")
            for k, v in sorted(r["tags"].items()):
                print(f"    {k}: {v}")
    return 0
