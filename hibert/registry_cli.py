"""`hibert registry list|show` — what is in the MLflow model registry; `hibert registry sync RUN_DIR` — send
what a run kept while its tracking server was away (metrics, the export, its registration).

Read-only: a sqlite store that does not exist is reported, never created (MLflow would create the file
and its tables on first touch). A target that names a missing model, alias or version is an error
(exit 1) that says what does exist. Printed URIs have their credentials masked.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hibert.config import ConfigError, load_config
from hibert.config.load import RESOLVED_NAME
from hibert.redact import redact_uri
from hibert.errors import UserError
from hibert.registry import check_reachable, list_versions, sqlite_path, tracking_uri
from hibert.runtime.outbox import Outbox
from hibert.runtime.tracking import Tracker


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "show", "sync"], help="list: every registered version; "
                   "show: one model's versions with tags (TARGET: NAME, NAME@ALIAS or NAME/VERSION); "
                   "sync: send a run directory's tracking outbox (what a tracking outage left unsent)")
    p.add_argument("target", nargs="?", default=None,
                   help="model name, or name@alias / name/version for show; the run directory for sync")
    p.add_argument("--rejected", action="store_true", help="sync: also send again what the server refused "
                   "earlier (tracking/outbox.rejected.jsonl), e.g. once an expired token is renewed")
    p.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="sync: keep probing a server that is away for up to S seconds (default 0)")
    p.add_argument("--uri", default=None, help="tracking URI (default: $MLFLOW_TRACKING_URI or "
                   "sqlite:///<output-dir>/mlflow.db)")
    p.add_argument("--output-dir", default="runs", help="where the default sqlite registry lives")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _err(msg: str) -> int:
    print(f"hibert registry: {msg}", file=sys.stderr)
    return 1


def _is_missing(e: Exception) -> bool:
    return getattr(e, "error_code", None) == "RESOURCE_DOES_NOT_EXIST" or "RESOURCE_DOES_NOT_EXIST" in str(e)


def sync(args: argparse.Namespace) -> int:
    """Send `<run dir>/tracking/outbox.jsonl` to the run's store (its resolved config names it; --uri wins)."""
    from hibert.runtime.writer_lock import try_claim  # lazy: pulls torch (~0.95 s); --help, list, show never need it

    if not args.target:
        print("hibert registry sync: give the run directory, e.g. runs/demo/finetune-ext", file=sys.stderr)
        return 2
    run_dir = Path(args.target)
    resolved = run_dir / RESOLVED_NAME
    if not resolved.is_file():
        return _err(f"{run_dir} is not a run directory (no {RESOLVED_NAME})")
    try:
        cfg = load_config(str(resolved), [f"tracking.uri={args.uri}"] if args.uri else [])
    except ConfigError as e:
        return _err(f"{resolved}: {e}")
    outbox = Outbox(run_dir)
    if not len(outbox) and not (args.rejected and outbox.rejected()):
        print(f"{run_dir}: nothing to send ({outbox.rejected()} refused earlier, in {outbox.rejected_path}: "
              "--rejected sends them again)" if outbox.rejected() else f"{run_dir}: nothing to send")
        return 0
    lock, holder = try_claim(run_dir)  # the running job owns its outbox
    if holder:
        return _err(f"{run_dir} is in use by {holder}: it sends its own outbox")
    try:
        if args.rejected:
            outbox.requeue_rejected()
        waiting = len(outbox)
        tracker = Tracker(cfg, enabled=True, run_dir=run_dir)
        left = tracker.sync(wait_s=args.wait)
        rejected = tracker.rejected()
    finally:
        if lock is not None:
            lock.release()
    shown = redact_uri(tracker.uri)
    if left:
        return _err(f"{shown} is still unreachable: {left} of {waiting} operation(s) wait in {outbox.path}")
    print(f"{run_dir}: sent {waiting} operation(s) to {shown}"
          + (f"; {rejected} refused by the server, kept in {outbox.rejected_path}" if rejected else ""))
    return 1 if rejected else 0


def run(args: argparse.Namespace) -> int:
    if args.action == "sync":
        return sync(args)
    uri = tracking_uri(args.uri, args.output_dir, create=False)
    shown = redact_uri(uri)
    name, alias, version = args.target, None, None
    if name and "@" in name:
        name, alias = name.split("@", 1)
    elif name and "/" in name:
        name, version = name.split("/", 1)
    if args.action == "show" and not name:
        print("hibert registry show: give a model name, e.g. hibert-encoder@in-domain", file=sys.stderr)
        return 2
    try:
        check_reachable(uri)
    except UserError as e:
        return _err(str(e))
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        msg = f"no registered models: no MLflow store at {db}; runs create it"
        if args.action == "show" or name:
            return _err(f"{args.target!r} not found: no MLflow store at {db}; runs create it")
        print(json.dumps([]) if args.json else msg)
        return 0
    try:
        rows = list_versions(uri, name)
    except Exception as e:  # mlflow raises its own exception types for unknown models
        if name and _is_missing(e):
            try:
                others = sorted({r["name"] for r in list_versions(uri)})
            except Exception:
                others = []
            return _err(f"no registered model {name!r} at {shown} "
                        f"(registered: {', '.join(others) if others else 'none'})")
        return _err(redact_uri(str(e)))
    if alias:
        known = sorted({a for r in rows for a in r["aliases"]})
        rows = [r for r in rows if alias in r["aliases"]]
        if not rows:
            return _err(f"model {name!r} has no alias {alias!r} "
                        f"(aliases: {', '.join(known) if known else 'none'}) at {shown}")
    if version:
        known_v = [r["version"] for r in rows]
        rows = [r for r in rows if r["version"] == version]
        if not rows:
            return _err(f"model {name!r} has no version {version!r} "
                        f"(versions: {', '.join(known_v) if known_v else 'none'}) at {shown}")
    if name and not rows:
        return _err(f"model {name!r} has no versions at {shown}")
    if args.json:
        print(json.dumps([{**r, "source": redact_uri(r["source"])} for r in rows], indent=2))
        return 0
    if not rows:
        print(f"no registered models at {shown}")
        return 0
    for r in rows:
        aliases = ",".join(r["aliases"]) or "-"
        print(f"{r['name']:<22} v{r['version']:<4} aliases={aliases:<22} run={r['run_id']}")
        if args.action == "show":
            print(f"    source: {redact_uri(r['source'])}")
            for k, v in sorted(r["tags"].items()):
                print(f"    {k}: {redact_uri(v) if isinstance(v, str) else v}")
    return 0
