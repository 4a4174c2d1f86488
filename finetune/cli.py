"""`hibert finetune`, `hibert evaluate`, `hibert summarize`."""
from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

from hibert.config import Config


def add_finetune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--init", default=None, metavar="REF",
                   help="encoder to start from: models:/hibert-encoder@in-domain, an export dir, or 'random'")
    p.add_argument("--nproc", type=int, default=None, help="start N local ranks (CPU: gloo)")


def run_finetune(cfg: Config, args: argparse.Namespace) -> int:
    if getattr(args, "init", None):
        cfg.run.init = None if args.init == "random" else args.init
    cfg.run.stage = "finetune"
    cfg.objective.kind = "extractive"
    if args.nproc and "RANK" not in os.environ and "SLURM_PROCID" not in os.environ:
        from pretrain.runtime import relaunch

        return relaunch(cfg, "finetune", args.nproc)
    from finetune.extractive_task import ExtractiveTask
    from pretrain.runtime import prepare_run, run_task

    inputs = prepare_run(cfg)
    if inputs.init is not None:  # the encoder's own size and vocabulary; this run's dropout
        model_cfg = inputs.init.model_cfg.model_copy(update={"dropout": cfg.model.dropout})
    else:
        model_cfg = cfg.model.model_copy(update={"vocab_size": inputs.vocab_size})
    task = ExtractiveTask(cfg, model_cfg, inputs.init.state if inputs.init else None)
    return run_task(cfg, inputs, task, "finetune")


def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="finetuned model: models:/hibert-extractive@latest or an "
                   "export dir (default: <run dir>/export)")
    p.add_argument("--split", default="test", help="split to evaluate (k is tuned on 'valid')")
    p.add_argument("--out", default=None, help="report directory (default: <run dir>/report-<split>)")
    p.add_argument("--no-tune", action="store_true", help="use the model's k and trigram blocking as trained")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the CIs")


def _model_ref(cfg: Config, ref: str | None) -> str:
    return ref or str(cfg.run_dir / "export")


def run_evaluate(cfg: Config, args: argparse.Namespace) -> int:
    import torch

    from data_prep import DocumentDataset
    from finetune.evaluation import (chunk_to_doc_scores, documents, evaluate_systems, tune_selection,
                                     write_report)
    from finetune.inference import load_extractive, score_split
    from hibert.redact import redact_uri
    from hibert.registry import resolve_model, tracking_uri
    from pretrain.trainer import file_hash

    log = logging.getLogger("hibert.evaluate")
    uri = tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    ref = _model_ref(cfg, args.model)
    local = resolve_model(ref, uri, cfg.run_dir / "eval-model")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, meta = load_extractive(local, device)
    test = DocumentDataset(cfg.data.dataset_dir, args.split)
    if len(test) == 0:
        raise SystemExit(f"hibert evaluate: split {args.split!r} of {cfg.data.dataset_dir} is empty")
    k, tb = meta["selection"].get("top_k", cfg.objective.top_k), meta["selection"].get("trigram_blocking", False)
    tuning = None
    if not args.no_tune:
        valid = DocumentDataset(cfg.data.dataset_dir, "valid")
        if len(valid):
            tuning = tune_selection(valid, score_split(model, valid, device))
            k, tb = tuning["k"], tuning["trigram_blocking"]
            log.info("tuned on valid: k=%d trigram_blocking=%s", k, tb)
    docs = documents(test)
    scores = chunk_to_doc_scores(test, score_split(model, test, device))
    result = evaluate_systems(docs, scores, k, tb, n_resamples=args.bootstrap)
    manifest = Path(cfg.data.dataset_dir) / "manifest.json"
    report_meta = {"model": redact_uri(ref), "encoder_init": meta.get("init"), "dataset": str(cfg.data.dataset_dir),
                   "split": args.split, "k": k,
                   "trigram_blocking": tb, "dataset_manifest": file_hash(manifest) if manifest.is_file() else "none",
                   "finetune_run": meta.get("mlflow_run_id")}
    out = Path(args.out) if args.out else cfg.run_dir / f"report-{args.split}"
    paths = write_report(out, result, docs, report_meta)
    if tuning:
        (out / "tuning.json").write_text(json.dumps(tuning, indent=1))
    _log_to_mlflow(cfg, uri, out, result, report_meta)
    for name, sc in result["systems"].items():
        print(f"{name:8s} " + "  ".join(f"{m.replace('_f', '')}={sc[m]['mean']:.2f}"
                                        f"[{sc[m]['low']:.2f},{sc[m]['high']:.2f}]"
                                        for m in ("rouge1_f", "rouge2_f", "rougeL_f")))
    print(f"report: {paths['md']}  chart: {paths['png']}")
    return 0


def _log_to_mlflow(cfg: Config, uri: str, out: Path, result: dict, meta: dict) -> None:
    import mlflow

    from hibert.redact import redact_uri
    from hibert.registry import ensure_experiment

    ensure_experiment(uri, cfg.tracking.experiment)
    with mlflow.start_run(run_name=f"{cfg.run.name}-evaluate-{meta['split']}"):
        mlflow.set_tags({"stage": "evaluate", "dataset_manifest": meta["dataset_manifest"],
                         "model": redact_uri(str(meta["model"])), "encoder_init": redact_uri(str(meta["encoder_init"]))})
        mlflow.log_params({"k": meta["k"], "trigram_blocking": meta["trigram_blocking"], "split": meta["split"]})
        for system, sc in result["systems"].items():
            mlflow.log_metrics({f"{system}_{m}": v["mean"] for m, v in sc.items()})
        mlflow.log_artifacts(str(out), artifact_path="report")


def add_summarize_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="finetuned model: models:/hibert-extractive@latest or an export dir")
    p.add_argument("--input", "-i", default="-", help="a text file (one document), a .jsonl file "
                   "(one document per line, field --field), or - for stdin")
    p.add_argument("--field", default="text", help="JSONL field holding the document text")
    p.add_argument("--k", type=int, default=None, help="sentences to extract (default: the model's)")
    p.add_argument("--limit", type=int, default=None, help="summarize at most N documents of a JSONL input")
    p.add_argument("--json", action="store_true", help="print one JSON object per document")


def run_summarize(cfg: Config, args: argparse.Namespace) -> int:
    import sys

    import torch

    from finetune.summarize import InputError, Summarizer, read_documents
    from hibert.registry import resolve_model, tracking_uri

    ref = _model_ref(cfg, args.model)
    try:  # every input problem is reported before the (slow) model load
        inputs = list(read_documents(args.input, args.field, args.limit))
    except InputError as e:
        print(f"hibert summarize: {e}", file=sys.stderr)
        return 2
    try:
        local = resolve_model(ref, tracking_uri(cfg.tracking.uri, cfg.run.output_dir), cfg.run_dir / "summarize-model")
        summarizer = Summarizer(local, "cuda" if torch.cuda.is_available() else "cpu", cfg.data.segmenter.stanza_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"hibert summarize: cannot load model {ref!r}: {e}", file=sys.stderr)
        return 2
    try:
        for doc_id, text in inputs:
            s = summarizer(doc_id, text, args.k)
            if args.json:
                print(json.dumps({"id": s.doc_id, "summary": s.sentences, "indices": s.indices,
                                  "num_sentences": s.num_sentences, "note": s.note}))
            else:
                note = f" ({s.note})" if s.note else ""
                print(f"# {s.doc_id}: {len(s.sentences)} of {s.num_sentences} sentences{note}")
                print("\n".join(s.sentences) if s.sentences else "(no summary: the document has no sentences)")
    except InputError as e:
        print(f"hibert summarize: {e}", file=sys.stderr)
        return 2
    return 0
