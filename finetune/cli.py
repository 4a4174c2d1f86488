"""`hibert finetune`, `hibert evaluate`, `hibert summarize`: parse the command line into typed settings, ask
the head registry (hibert/heads.py) which head to run, and turn the library's `UserError`s into one line.

The runtime, the export loaders, torch and MLflow are imported inside the handlers: together they cost ~2.5 s
(`python -X importtime`), which `hibert --help` and the other commands (which build this parser) would pay;
the heads themselves load on first use of the registry.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from pathlib import Path

from filelock import FileLock, Timeout

from hibert.config import Config, save_resolved
from hibert.config.mds import ranking_kind
from hibert.data_prep import DocumentDataset
from hibert.errors import UserError
from hibert.finetune.inference.flags import (
    SettingError,
    add_flag_arguments,
    check_flags,
    flags_from_args,
    resolve_settings,
)
from hibert.finetune.inference.fluency import fluency_note
from hibert.finetune.inference.text import (
    DEFAULT_MAX_CHARS,
    InputError,
    Summary,
    check_lengths,
    max_doc_chars,
    read_clusters,
    read_documents,
)
from hibert.finetune.settings import EvalSettings, SummarizeSettings, default_device, model_ref
from hibert.heads import EvalOutcome, get_head, head_of_export, is_builtin
from hibert.redact import redact_uri
from hibert.registry import (
    check_store_location,
    parse_models_ref,
    pin_model_ref,
    reachable,
    resolve_model,
    tracking_uri,
)
from hibert.runtime.launch import relaunch
from hibert.runtime.outbox import Outbox, drain
from hibert.runtime.tracking import evaluation_op, send

log = logging.getLogger("hibert")


def _ranking_arg(value: str) -> str:
    """--ranking, parsed as `mds.ranking` is (one parser: hibert.config.mds.ranking_kind)."""
    try:
        ranking_kind(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _device() -> str:
    return default_device()  # torch (~1 s) only when a model is about to load; see the module docstring


# ------------------------------------------------------------------------------------------------ finetune
def add_finetune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--init", default=None, metavar="REF",
                   help="encoder to start from: models:/hibert-encoder@in-domain, an export dir, or 'random'")
    p.add_argument("--nproc", type=int, default=None, help="start N local ranks (CPU: gloo)")


def run_finetune(cfg: Config, args: argparse.Namespace) -> int:
    """The head named by `finetune.task` on the shared runtime (hibert/runtime/run.py)."""
    if getattr(args, "init", None):
        cfg.run.init = None if args.init == "random" else args.init
    cfg.run.stage = "finetune"
    if args.nproc and "RANK" not in os.environ and "SLURM_PROCID" not in os.environ:
        if not is_builtin(cfg.finetune.task):  # a plugin's head, or a typo: one line here, before any rank starts
            try:
                get_head(cfg.finetune.task)
            except UserError as e:
                print(e, file=sys.stderr)
                return 1
        return relaunch(cfg, "finetune", args.nproc)   # a built-in head: the ranks import it (~2 s), not this process
    from hibert.runtime.run import prepare_run, run_task  # lazy: torch + DeepSpeed (~3 s), which the launcher and
    # evaluate / summarize never need

    try:
        head = get_head(cfg.finetune.task)
        inputs = prepare_run(cfg)
        if inputs.rt.is_main:
            log.info("finetune: head %s (reads %s; its config: %s) -> registered model %s", head.name, head.reads,
                     ", ".join(head.config) or "none of its own", head.registered_model)
        task = head.build_task(cfg, inputs, inputs.model_cfg)   # the init encoder's size, or the configured one
    except UserError as e:
        print(e, file=sys.stderr)
        return 1
    return run_task(cfg, inputs, task, "finetune")


# ------------------------------------------------------------------------------------------------ evaluate
def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="finetuned model: models:/hibert-extractive@latest or an "
                   "export dir (default: <run dir>/export)")
    p.add_argument("--split", default="test", help="split to evaluate")
    p.add_argument("--out", default=None, help="report directory (default: <run dir>/report-<split>)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the CIs")
    p.add_argument("--compare", nargs="*", default=[], metavar="NAME=REPORT",
                   help="pair this model with other runs on the same documents: NAME=<run dir | report dir | "
                        "report.json> (e.g. the extractive model, a random-init decoder)")
    p.add_argument("--limit", type=positive_int, default=None, help="abstractive: decode only the first N documents")
    p.add_argument("--budget-tokens", type=int, default=None, help="clusters: source tokens the model reads "
                   "(default: as trained; e.g. train on 800, test on 1600)")
    p.add_argument("--ranking", type=_ranking_arg, default=None, help="clusters: how units are ranked before the budget cut "
                   "(tfidf, lead, oracle, or a ranker: models:/hibert-ranker@finetuned); default: the model's")
    add_flag_arguments(p, "evaluate")


def positive_int(text: str) -> int:
    """argparse type of a count: an integer >= 1 (0 or a negative count is a mistake, not "all")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def _model_ref(cfg: Config, ref: str | None) -> str:
    return model_ref(cfg, ref)


def _settings(kind: type, args: argparse.Namespace, command: str):
    """The command's typed settings from its arguments; None (after one line naming the flag) when a flag cannot
    work: such flags fail first, before anything resolves or loads."""
    settings = kind(flags=flags_from_args(args), **{k: v for k, v in vars(args).items()
                                                     if k in kind.__dataclass_fields__ and k != "flags"})
    try:
        check_flags(settings.flags)
    except SettingError as e:
        print(f"hibert {command}: {e}", file=sys.stderr)
        return None
    return settings


def _fluency(head, local: Path, command: str) -> str | None:
    """One line when the model's decoder cannot write yet (finetune/inference/fluency.py); the command goes on.
    Returns the note."""
    note = fluency_note(local) if head.decodes else None
    if note:
        print(f"hibert {command}: note: {note}", file=sys.stderr)
    return note


def run_evaluate(cfg: Config, args: argparse.Namespace) -> int:

    settings = _settings(EvalSettings, args, "evaluate")
    if settings is None:
        return 2
    out = settings.report_dir(cfg.run_dir)
    if out.exists() and not out.is_dir():   # before any scoring: not a traceback after it
        print(f"hibert evaluate: --out {out} is a file; name a directory (the report is several files)",
              file=sys.stderr)
        return 2
    return _evaluate(cfg, args, settings, out)


def _report_lock(out: Path) -> FileLock | str:
    """One evaluation owns a report directory at a time, through the MLflow logging: a second one (another --k,
    say) would otherwise overwrite the files the first then logs as its artifacts. The held lock, or why not."""
    lock = FileLock(str(out.parent / f".{out.name}.lock"))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=0)
    except Timeout:
        return (f"hibert evaluate: another hibert evaluate is writing {out} (it holds {lock.lock_file}); wait for it "
                "to finish, or pass --out to report elsewhere")
    except OSError as e:
        return f"hibert evaluate: cannot write the report directory {out}: {e}"
    return lock


def _evaluate(cfg: Config, args: argparse.Namespace, settings: EvalSettings, out: Path) -> int:
    uri = tracking_uri(cfg.tracking.uri, cfg.run.output_dir, create=False)
    ref = _model_ref(cfg, args.model)
    try:  # the report is logged to that store at the end: a copied store must not write into the original
        check_store_location(uri, cfg.tracking.experiment)
    except UserError as e:
        print(f"hibert evaluate: {e}", file=sys.stderr)
        return 2
    try:
        local = resolve_model(ref, uri)   # a registered version: the user's model cache, not the run dir
    except (FileNotFoundError, UserError) as e:
        print(f"hibert evaluate: cannot load model {ref!r}: {e}", file=sys.stderr)
        return 2
    try:  # the flags over the model's own settings, once, before it loads: what the evaluation runs with
        head = head_of_export(local)  # (a head module named in $HIBERT_HEADS that fails to import: one line)
        resolved = resolve_settings(head, local, settings.flags)
    except SettingError as e:
        print(f"hibert evaluate: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # its settings files do not parse
        print(f"hibert evaluate: cannot load model {ref!r}: {e}", file=sys.stderr)
        return 2
    _fluency(head, local, "evaluate")
    lock = _report_lock(out)   # after every check (nothing written for a refused run), before any scoring
    if isinstance(lock, str):
        print(lock, file=sys.stderr)
        return 2
    try:
        return _score_and_log(cfg, settings, head, local, ref, resolved, uri)
    finally:
        lock.release()


def _score_and_log(cfg: Config, settings: EvalSettings, head, local: Path, ref: str, resolved, uri: str) -> int:
    try:
        clusters = DocumentDataset(cfg.data.dataset_dir, settings.split).is_clusters
        outcome = head.evaluate(cfg, settings, local, ref, clusters, resolved)
    except FileNotFoundError as e:  # the dataset (or a file of the model) is not there
        print(f"hibert evaluate: {e}", file=sys.stderr)
        return 1
    except UserError as e:
        print(e, file=sys.stderr)
        return 1
    registered = _registered_version(head, local, ref, uri)
    if registered:
        outcome.meta["registered_version"] = registered
    if outcome.result is not None:  # the report's metrics join the store (made here if it is the default one)
        _log_to_mlflow(cfg, tracking_uri(cfg.tracking.uri, cfg.run.output_dir), outcome)
    print("\n".join(outcome.lines))
    return 0


def _registered_version(head, local: Path, ref: str, uri: str) -> str | None:
    """"<registered model>/<version>": the version a models:/ reference points at (the downloaded files do not
    record it: registry.json is written after the upload), or the one a run's export recorded; else None."""
    if ref.startswith("models:/"):
        try:
            pinned = parse_models_ref(pin_model_ref(ref, uri))
        except Exception:  # noqa: BLE001 - the tag is a convenience: the evaluation does not depend on it
            return None
        return f"{pinned[0]}/{pinned[2]}" if pinned and pinned[2] else None
    try:
        version = json.loads((Path(local) / "registry.json").read_text()).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return f"{head.registered_model}/{version}" if version else None


def _log_to_mlflow(cfg: Config, uri: str, outcome: EvalOutcome) -> None:
    """The evaluation's MLflow run — tags, params, the mean scores, the report directory, the per-document
    table — as one outbox operation: sent now when the server answers (a 2 s probe, no MLflow retry storm),
    else kept, with one line saying so and how to send it (`hibert registry sync`). Evaluations keep their own
    outbox (`<run dir>/evaluate-outbox`, with this evaluation's config): a training run's outbox may hold
    operations for another store, which must not be sent here."""
    meta, result = outcome.meta, outcome.result
    table = per_document_table(result)
    keep = cfg.run_dir / "evaluate-outbox"
    outbox = Outbox(keep)
    op = evaluation_op(
        outbox, cfg.tracking.experiment, f"{cfg.run.name}-evaluate-{meta['split']}",
        tags={"stage": "evaluate", "dataset_manifest": meta["dataset_manifest"],
              "model": redact_uri(str(meta["model"])), "encoder_init": redact_uri(str(meta["encoder_init"])),
              # the run it evaluates (nested under it in the MLflow UI when it is in this store) and the version
              **({"finetune_run": str(meta["finetune_run"])} if meta.get("finetune_run") else {}),
              **({"registered_version": meta["registered_version"]} if meta.get("registered_version") else {}),
              **({"mlflow.note.content": "\n\n".join(meta["notes"])} if meta.get("notes") else {})},
        params={k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in meta.items()
                if k in ("k", "trigram_blocking", "split", "generation", "compared_with")},
        metrics={f"{system}_{m}": v["mean"] for system, sc in result["systems"].items() for m, v in sc.items()},
        report_dir=outcome.out, table=table if table["doc_id"] else None)
    save_resolved(cfg, keep)  # what `hibert registry sync` reads the store from
    outbox.append(op)
    left = drain(outbox, lambda ops: send(uri, ops), lambda: reachable(uri)) if reachable(uri) else len(outbox)
    if left:
        print(f"hibert evaluate: tracking server {redact_uri(uri)} is unreachable: the report is in {outcome.out}; "
              f"its MLflow run waits in {outbox.path} (send it with `hibert registry sync {keep}` once the "
              "server is back)", file=sys.stderr)
    elif not outbox.rejected_path.exists():   # everything sent: an outbox left behind would read as pending work
        shutil.rmtree(keep, ignore_errors=True)


def per_document_table(result: dict) -> dict[str, list]:
    """One row per (document, system): its ROUGE F1 of the headline metrics."""
    ids, per_doc = result.get("doc_ids", []), result.get("per_document", {})
    table: dict[str, list] = {"doc_id": [], "system": []}
    for system, scores in per_doc.items():
        table["doc_id"] += list(ids)
        table["system"] += [system] * len(ids)
        for metric, values in scores.items():
            table.setdefault(metric, []).extend(values)
    return table


# ------------------------------------------------------------------------------------------------ summarize
def add_summarize_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="finetuned model: models:/hibert-extractive@latest or an export dir")
    p.add_argument("--input", "-i", action="append", default=None,
                   help="a text file (one document), a .jsonl file (one document per line, field --field), or - "
                   "for stdin; a multi-document model: several --input files = one cluster, or a .jsonl file "
                   "with a list of documents per line (field --field, default documents)")
    p.add_argument("--ranking", type=_ranking_arg, default=None, help="multi-document model: rank units by tfidf or lead, or "
                   "by a ranker (models:/hibert-ranker@finetuned); default: as the model was trained")
    p.add_argument("--field", default="text", help="JSONL field holding the document text")
    p.add_argument("--limit", type=positive_int, default=None, help="summarize at most N documents of a JSONL input")
    p.add_argument("--json", action="store_true", help="print one JSON object per document")
    c = p.add_argument_group("a whole corpus (--output): streamed, resumable, one line per input record, in order")
    c.add_argument("--output", "-o", default=None, help="write JSON lines here instead of printing: a .jsonl file "
                   "or a datasets save_to_disk directory as --input; rerun the same command to resume")
    c.add_argument("--nproc", type=positive_int, default=1, help="split the corpus over N local processes "
                   "(one GPU each where there are GPUs); one merged output")
    c.add_argument("--shard", default=None, metavar="I/N", help="summarize only shard I of N (a Slurm array task: "
                   "\"$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT\"); then --merge --shards N")
    c.add_argument("--merge", action="store_true", help="merge the N finished shards (--shards N) into --output")
    c.add_argument("--shards", type=positive_int, default=None, help="with --merge: how many shards there are")
    c.add_argument("--id-field", default=None, help="record field holding the document id (default: 'id' if "
                   "present, else FILE:LINE)")
    c.add_argument("--split", default=None, help="datasets input: the split of a saved DatasetDict (default test)")
    c.add_argument("--window", type=positive_int, default=None, help="records read, decoded (batched by length) "
                   "and written together (default: 64, or --batch-size if larger)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_flag_arguments(p, "summarize")


def _print_summary(s: Summary, clusters: bool, as_json: bool, model_note: str | None = None) -> None:
    if as_json:   # each record carries the model's note, as the served model's answers do
        print(json.dumps(s.record(clusters, model_note)))
    elif clusters:
        print(f"# {s.doc_id}: {len(s.sentences)}-sentence abstract of a cluster ({s.note})")
        print("\n".join(s.sentences) if s.sentences else "(no summary: the cluster has no sentences)"
              if not s.num_sentences else "(empty summary: the model ended it at once)")
    else:
        note = f" ({s.note})" if s.note else ""
        what = (f"{len(s.sentences)}-sentence abstract of {s.num_sentences} sentences" if s.indices == []
                and s.sentences else f"{len(s.sentences)} of {s.num_sentences} sentences")
        print(f"# {s.doc_id}: {what}{note}")
        print("\n".join(s.sentences) if s.sentences else "(no summary: the document has no sentences)")


def run_summarize(cfg: Config, args: argparse.Namespace) -> int:

    settings = _settings(SummarizeSettings, args, "summarize")
    if settings is None:
        return 2
    corpus_flags = [f for f, v in (("--nproc", args.nproc != 1), ("--shard", args.shard), ("--merge", args.merge),
                                   ("--shards", args.shards)) if v]
    if args.output:
        from hibert.finetune.corpus_cli import run_summarize_corpus  # lazy: ~17 ms on every command's --help

        return run_summarize_corpus(cfg, args, settings)
    if corpus_flags:
        print(f"hibert summarize: {', '.join(corpus_flags)} summarize a corpus into a file: add --output", file=sys.stderr)
        return 2
    ref = _model_ref(cfg, args.model)
    sources = args.input or ["-"]
    missing = [s for s in sources if s != "-" and not Path(s).is_file()]
    if missing:   # before the model resolves: a registered one may download first
        print(f"hibert summarize: input {missing[0]!r} is not a file", file=sys.stderr)
        return 2
    try:
        local = resolve_model(ref, tracking_uri(cfg.tracking.uri, cfg.run.output_dir, create=False))
        head, load_error = head_of_export(local), None
    except (FileNotFoundError, ValueError) as e:
        head, load_error = None, e
    clusters = head is not None and head.reads == "clusters"
    max_chars = max_doc_chars(local) if head is not None else DEFAULT_MAX_CHARS
    try:  # every input problem is reported before the (slow) model load
        if clusters:
            inputs = list(read_clusters(sources, args.field, args.limit, max_chars))
        elif len(sources) > 1:
            raise InputError(f"{len(sources)} inputs: several files make one cluster, which needs a multi-document "
                             "(mds) model")
        else:
            inputs = list(read_documents(sources[0], args.field, args.limit, max_chars))
        if head is not None:
            check_lengths(inputs, local, clusters)
    except InputError as e:
        print(f"hibert summarize: {e}", file=sys.stderr)
        return 2
    try:
        if head is None:
            raise load_error
        resolved = resolve_settings(head, local, settings.flags)  # the flags over the model's own: no weights
        if head.summarizer is None:
            raise ValueError(f"a {head.name} model does not summarize")
        summarizer = head.summarizer(cfg, local, _device(), resolved, settings)
    except SettingError as e:
        print(f"hibert summarize: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        print(f"hibert summarize: cannot load model {ref!r}: {e}", file=sys.stderr)
        return 2
    note = _fluency(head, local, "summarize")
    try:
        summaries = summarizer.summarize_all(inputs)
    except InputError as e:
        print(f"hibert summarize: {e}", file=sys.stderr)
        return 2
    for s in summaries:
        _print_summary(s, clusters, args.json, note)
    return 0
