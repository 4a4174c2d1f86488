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
    """The head named by `finetune.task` on the shared runtime (pretrain/runtime.py)."""
    if getattr(args, "init", None):
        cfg.run.init = None if args.init == "random" else args.init
    cfg.run.stage = "finetune"
    cfg.objective.kind = cfg.finetune.task
    if args.nproc and "RANK" not in os.environ and "SLURM_PROCID" not in os.environ:
        from pretrain.runtime import relaunch

        return relaunch(cfg, "finetune", args.nproc)
    from pretrain.runtime import prepare_run, run_task

    inputs = prepare_run(cfg)
    if inputs.init is not None:  # the encoder's own size and vocabulary; this run's dropout
        model_cfg = inputs.init.model_cfg.model_copy(update={"dropout": cfg.model.dropout})
    else:
        model_cfg = cfg.model.model_copy(update={"vocab_size": inputs.vocab_size})
    if cfg.finetune.task == "abstractive":
        return _run_abstractive(cfg, inputs, model_cfg)
    from finetune.extractive_task import ExtractiveTask

    task = ExtractiveTask(cfg, model_cfg, inputs.init.state if inputs.init else None)
    return run_task(cfg, inputs, task, "finetune")


def _run_abstractive(cfg: Config, inputs, model_cfg) -> int:
    from finetune.abstractive_data import FirstChunks
    from finetune.abstractive_task import AbstractiveTask
    from pretrain.runtime import run_task

    decoder_state = None
    if cfg.finetune.init_decoder:
        decoder_state = _pretraining_decoder(cfg, inputs.init)
    inputs.train, inputs.valid = FirstChunks(inputs.train), FirstChunks(inputs.valid)
    if len(inputs.train) == 0:
        raise SystemExit(f"hibert finetune: {cfg.data.dataset_dir} has no training documents with summaries; "
                         "abstractive finetuning needs a corpus with summaries")
    log = logging.getLogger("hibert")
    if inputs.rt.is_main:
        log.info("abstractive: %d train / %d valid documents (first chunks; %d later chunks of long documents "
                 "left out)", len(inputs.train), len(inputs.valid), inputs.train.skipped_later_chunks)
    task = AbstractiveTask(cfg, model_cfg, inputs.init.state if inputs.init else None, decoder_state)
    return run_task(cfg, inputs, task, "finetune")


def _pretraining_decoder(cfg: Config, init):
    """The masked-sentence decoder exported next to a pretrained encoder (finetune.init_decoder)."""
    from safetensors.torch import load_file

    path = None if init is None else Path(init.local_dir) / "decoder.safetensors"
    if path is None or not path.is_file():
        raise SystemExit(f"hibert finetune: finetune.init_decoder=true needs run.init to name a pretraining "
                         f"export with decoder.safetensors (run.init={cfg.run.init})")
    return load_file(str(path))


def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="finetuned model: models:/hibert-extractive@latest or an "
                   "export dir (default: <run dir>/export)")
    p.add_argument("--split", default="test", help="split to evaluate (k is tuned on 'valid')")
    p.add_argument("--out", default=None, help="report directory (default: <run dir>/report-<split>)")
    p.add_argument("--no-tune", action="store_true", help="use the model's k and trigram blocking as trained")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the CIs")
    p.add_argument("--compare", nargs="*", default=[], metavar="NAME=REPORT",
                   help="pair this model with other runs on the same documents: NAME=<run dir | report dir | "
                        "report.json> (e.g. the extractive model, a random-init decoder)")
    p.add_argument("--limit", type=int, default=None, help="abstractive: decode only the first N documents")
    from finetune.abstractive_eval import add_generation_arguments

    add_generation_arguments(p)


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
    from finetune.abstractive_eval import evaluate_abstractive, is_abstractive_export

    if is_abstractive_export(local):
        done = evaluate_abstractive(cfg, args, local, ref, uri)
        _log_to_mlflow(cfg, uri, done["out"], done["result"], done["meta"])
        _print_scores(done["result"], done["paths"])
        return 0
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
    if args.compare:
        from finetune.abstractive_eval import compared_reports, pair_with_reports

        pair_with_reports(result, compared_reports(args.compare, args.split), args.bootstrap)
        paths = write_report(out, result, docs, report_meta)
    _log_to_mlflow(cfg, uri, out, result, report_meta)
    _print_scores(result, paths)
    return 0


def _print_scores(result: dict, paths: dict) -> None:
    for name, sc in result["systems"].items():
        print(f"{name:8s} " + "  ".join(f"{m.replace('_f', '')}={sc[m]['mean']:.2f}"
                                        f"[{sc[m]['low']:.2f},{sc[m]['high']:.2f}]"
                                        for m in ("rouge1_f", "rouge2_f", "rougeL_f")))
    for pair, by_metric in result.get("paired", {}).items():
        d = by_metric["rouge1_f"]
        print(f"{pair:16s} R1 {d['diff']:+.2f} [{d['low']:+.2f},{d['high']:+.2f}] p={d['p_value']:.3g} (paired)")
    print(f"report: {paths['md']}  chart: {paths['png']}")


def _log_to_mlflow(cfg: Config, uri: str, out: Path, result: dict, meta: dict) -> None:
    import mlflow

    from hibert.redact import redact_uri
    from hibert.registry import ensure_experiment

    ensure_experiment(uri, cfg.tracking.experiment)
    with mlflow.start_run(run_name=f"{cfg.run.name}-evaluate-{meta['split']}"):
        mlflow.set_tags({"stage": "evaluate", "dataset_manifest": meta["dataset_manifest"],
                         "model": redact_uri(str(meta["model"])), "encoder_init": redact_uri(str(meta["encoder_init"]))})
        mlflow.log_params({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in meta.items()
                           if k in ("k", "trigram_blocking", "split", "generation", "compared_with")})
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
    from finetune.abstractive_eval import add_generation_arguments

    add_generation_arguments(p)


def run_summarize(cfg: Config, args: argparse.Namespace) -> int:
    import sys

    import torch

    from finetune.abstractive_eval import generation_from_args, is_abstractive_export
    from finetune.summarize import AbstractiveSummarizer, InputError, Summarizer, read_documents
    from hibert.registry import resolve_model, tracking_uri

    ref = _model_ref(cfg, args.model)
    try:  # every input problem is reported before the (slow) model load
        inputs = list(read_documents(args.input, args.field, args.limit))
    except InputError as e:
        print(f"hibert summarize: {e}", file=sys.stderr)
        return 2
    try:
        local = resolve_model(ref, tracking_uri(cfg.tracking.uri, cfg.run.output_dir), cfg.run_dir / "summarize-model")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if is_abstractive_export(local):
            abstractive = AbstractiveSummarizer(local, device, cfg.data.segmenter.stanza_dir,
                                                lambda base: generation_from_args(base, args))
            summaries = iter(abstractive.summarize_all(inputs))
            summarizer = lambda doc_id, text, k: next(summaries)  # noqa: E731 (decoded in batches above)
        else:
            summarizer = Summarizer(local, device, cfg.data.segmenter.stanza_dir)
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
                what = (f"{len(s.sentences)}-sentence abstract of {s.num_sentences} sentences" if s.indices == []
                        and s.sentences else f"{len(s.sentences)} of {s.num_sentences} sentences")
                print(f"# {s.doc_id}: {what}{note}")
                print("\n".join(s.sentences) if s.sentences else "(no summary: the document has no sentences)")
    except InputError as e:
        print(f"hibert summarize: {e}", file=sys.stderr)
        return 2
    return 0
