"""`hibert finetune`, `hibert evaluate`, `hibert summarize`."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from data_prep import DocumentDataset
from finetune.abstractive.data import FirstChunks
from finetune.abstractive.evaluate import evaluate_abstractive, evaluate_clusters
from finetune.abstractive.export import generation_for_export, is_abstractive_export
from finetune.abstractive.summarize import AbstractiveSummarizer
from finetune.abstractive.task import AbstractiveTask
from finetune.base.clusters import RANKINGS, all_units_view
from finetune.base.generation import DecodingFlagError, add_generation_arguments, check_generation_flags
from finetune.base.report import compared_reports, documents, pair_with_reports, write_report
from finetune.base.rouge import format_p
from finetune.base.text import InputError, read_clusters, read_documents
from finetune.extractive.evaluate import (
    chunk_to_doc_scores,
    evaluate_systems,
    tune_selection,
)
from finetune.extractive.export import load_extractive, score_split
from finetune.extractive.summarize import Summarizer
from finetune.extractive.task import ExtractiveTask
from finetune.mds.export import is_mds_export, load_mds
from finetune.mds.summarize import ClusterSummarizer
from finetune.mds.task import MDSTask
from finetune.ranker.evaluate import evaluate_ranker
from finetune.ranker.ranking import ranked_view
from finetune.ranker.task import RankerTask
from hibert.config import Config
from hibert.hashing import file_hash
from hibert.redact import redact_uri
from hibert.registry import ensure_experiment, resolve_model, tracking_uri
from hibert.runtime.run import prepare_run, relaunch, run_task


def add_finetune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--init", default=None, metavar="REF",
                   help="encoder to start from: models:/hibert-encoder@in-domain, an export dir, or 'random'")
    p.add_argument("--nproc", type=int, default=None, help="start N local ranks (CPU: gloo)")


def run_finetune(cfg: Config, args: argparse.Namespace) -> int:
    """The head named by `finetune.task` on the shared runtime (hibert/runtime/run.py)."""
    if getattr(args, "init", None):
        cfg.run.init = None if args.init == "random" else args.init
    cfg.run.stage = "finetune"
    cfg.objective.kind = cfg.finetune.task
    if args.nproc and "RANK" not in os.environ and "SLURM_PROCID" not in os.environ:

        return relaunch(cfg, "finetune", args.nproc)

    inputs = prepare_run(cfg)
    if inputs.init is not None:  # the encoder's own size and vocabulary; this run's dropout
        model_cfg = inputs.init.model_cfg.model_copy(update={"dropout": cfg.model.dropout})
    else:
        model_cfg = cfg.model.model_copy(update={"vocab_size": inputs.vocab_size})
    clusters = getattr(inputs.train, "is_clusters", False)
    if cfg.finetune.task in ("ranker", "mds") and not clusters:
        raise SystemExit(f"hibert finetune: finetune.task={cfg.finetune.task} needs a cluster dataset "
                         f"({cfg.data.dataset_dir} holds documents); prepare one from multi-document sources")
    if cfg.finetune.task == "ranker":
        return _run_ranker(cfg, inputs, model_cfg)
    if cfg.finetune.task in ("abstractive", "mds"):
        return _run_abstractive(cfg, inputs, model_cfg)
    if clusters:
        raise SystemExit(f"hibert finetune: finetune.task=extractive reads documents; {cfg.data.dataset_dir} "
                         "holds clusters (use finetune.task=ranker, mds or abstractive)")

    task = ExtractiveTask(cfg, model_cfg, inputs.init.state if inputs.init else None)
    return run_task(cfg, inputs, task, "finetune")


def _run_abstractive(cfg: Config, inputs, model_cfg) -> int:
    """The abstractive head on documents (first chunks), the flat baseline on clusters (ranked units back to
    back as one document), or the hierarchical multi-document model (finetune.task=mds)."""

    decoder_state = None
    if cfg.finetune.init_decoder:
        decoder_state = _pretraining_decoder(cfg, inputs.init)
    log = logging.getLogger("hibert")
    if getattr(inputs.train, "is_clusters", False):
        inputs.train, inputs.valid = (ranked_view(cfg, inputs.train, inputs.rt, reuse=True),
                                      ranked_view(cfg, inputs.valid, inputs.rt, reuse=True))
        if inputs.rt.is_main:
            log.info("%s: %d train / %d valid clusters (%d / %d without a summary left out)%s, units ranked by "
                     "%s, <= %d tokens", cfg.finetune.task, len(inputs.train), len(inputs.valid),
                     inputs.train.skipped_no_summary, inputs.valid.skipped_no_summary,
                     " (SYNTHETIC clusters)" if inputs.train.manifest.get("synthetic") else "",
                     cfg.mds.ranking, cfg.mds.budget_tokens)
    else:
        inputs.train, inputs.valid = FirstChunks(inputs.train), FirstChunks(inputs.valid)
        if inputs.rt.is_main:
            log.info("abstractive: %d train / %d valid documents (first chunks; %d later chunks of long documents "
                     "left out)", len(inputs.train), len(inputs.valid), inputs.train.skipped_later_chunks)
    if len(inputs.train) == 0:
        raise SystemExit(f"hibert finetune: {cfg.data.dataset_dir} has no training documents with summaries; "
                         "abstractive finetuning needs a corpus with summaries")
    cls = MDSTask if cfg.finetune.task == "mds" else AbstractiveTask
    task = cls(cfg, model_cfg, inputs.init.state if inputs.init else None, decoder_state)
    task.reads_clusters = task.reads_clusters or getattr(inputs.train, "is_clusters", False)
    return run_task(cfg, inputs, task, "finetune")


def _run_ranker(cfg: Config, inputs, model_cfg) -> int:

    inputs.train, inputs.valid = all_units_view(inputs.train), all_units_view(inputs.valid)
    if len(inputs.train) == 0:
        raise SystemExit(f"hibert finetune: {cfg.data.dataset_dir} has no training clusters with summaries")
    if inputs.rt.is_main:
        logging.getLogger("hibert").info(
            "ranker: %d train / %d valid clusters%s", len(inputs.train), len(inputs.valid),
            " (SYNTHETIC clusters)" if inputs.train.manifest.get("synthetic") else "")
    task = RankerTask(cfg, model_cfg, inputs.init.state if inputs.init else None)
    return run_task(cfg, inputs, task, "finetune")


def _pretraining_decoder(cfg: Config, init):
    """The masked-sentence decoder exported next to a pretrained encoder (finetune.init_decoder)."""

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
    p.add_argument("--budget-tokens", type=int, default=None, help="clusters: source tokens the model reads "
                   "(default: as trained; e.g. train on 800, test on 1600)")
    p.add_argument("--ranking", default=None, help="clusters: how units are ranked before the budget cut "
                   "(tfidf, lead, oracle, or a ranker: models:/hibert-ranker@finetuned); default: the model's")

    add_generation_arguments(p)


def _model_ref(cfg: Config, ref: str | None) -> str:
    return ref or str(cfg.run_dir / "export")


def run_evaluate(cfg: Config, args: argparse.Namespace) -> int:



    log = logging.getLogger("hibert.evaluate")
    try:  # decoding flags that cannot work fail first, on one line naming the flag
        check_generation_flags(args)
    except DecodingFlagError as e:
        print(f"hibert evaluate: {e}", file=sys.stderr)
        return 2
    uri = tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    ref = _model_ref(cfg, args.model)
    local = resolve_model(ref, uri, cfg.run_dir / "eval-model")
    if is_abstractive_export(local):  # (mds exports too) the flags against the model's settings, before it loads
        try:
            generation_for_export(local, args)
        except DecodingFlagError as e:
            print(f"hibert evaluate: {e}", file=sys.stderr)
            return 2
        except ValueError as e:  # its generation.json / abstractive.json do not parse
            print(f"hibert evaluate: cannot load model {ref!r}: {e}", file=sys.stderr)
            return 2
    if DocumentDataset(cfg.data.dataset_dir, args.split).is_clusters:
        return _evaluate_clusters(cfg, args, local, ref, uri)
    if is_mds_export(local) or (local / "ranker.json").is_file():
        raise SystemExit(f"hibert evaluate: {ref} is a multi-document model; {cfg.data.dataset_dir} holds "
                         "documents, not clusters")
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

        pair_with_reports(result, compared_reports(args.compare, args.split), args.bootstrap)
        paths = write_report(out, result, docs, report_meta)
    _log_to_mlflow(cfg, uri, out, result, report_meta)
    _print_scores(result, paths)
    return 0


def _evaluate_clusters(cfg: Config, args: argparse.Namespace, local: Path, ref: str, uri: str) -> int:

    if (local / "ranker.json").is_file():
        done = evaluate_ranker(cfg, args, local, ref)
        for name, by_cut in done["payload"]["recall"].items():
            print(f"{name:15s} " + "  ".join(f"L'={c}: {v['mean']:.2f}" for c, v in by_cut.items()))
        for pair, by_cut in done["payload"]["paired"].items():
            d = by_cut["5"]
            print(f"{pair:22s} L'=5 {d['diff']:+.2f} [{d['low']:+.2f},{d['high']:+.2f}] "
                  f"{format_p(d['p_value'], d['resamples'])} (paired)")
        print(f"report: {done['out'] / 'report.md'}")
        return 0
    if not (is_mds_export(local) or is_abstractive_export(local)):
        raise SystemExit(f"hibert evaluate: {ref} is an extractive model; {cfg.data.dataset_dir} holds clusters "
                         "(evaluate a ranker, mds or abstractive model on it)")
    done = evaluate_clusters(cfg, args, local, ref, is_mds_export(local))
    _log_to_mlflow(cfg, uri, done["out"], done["result"], done["meta"])
    _print_scores(done["result"], done["paths"])
    return 0


def _print_scores(result: dict, paths: dict) -> None:

    for name, sc in result["systems"].items():
        print(f"{name:8s} " + "  ".join(f"{m.replace('_f', '')}={sc[m]['mean']:.2f}"
                                        f"[{sc[m]['low']:.2f},{sc[m]['high']:.2f}]"
                                        for m in ("rouge1_f", "rouge2_f", "rougeL_f")))
    for pair, by_metric in result.get("paired", {}).items():
        d = by_metric["rouge1_f"]
        print(f"{pair:16s} R1 {d['diff']:+.2f} [{d['low']:+.2f},{d['high']:+.2f}] "
              f"{format_p(d['p_value'], d['resamples'])} (paired)")
    print(f"report: {paths['md']}  chart: {paths['png']}")


def _log_to_mlflow(cfg: Config, uri: str, out: Path, result: dict, meta: dict) -> None:
    import mlflow


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
    p.add_argument("--input", "-i", action="append", default=None,
                   help="a text file (one document), a .jsonl file (one document per line, field --field), or - "
                   "for stdin; a multi-document model: several --input files = one cluster, or a .jsonl file "
                   "with a list of documents per line (field --field, default documents)")
    p.add_argument("--ranking", default=None, help="multi-document model: rank units by tfidf or lead, or "
                   "by a ranker (models:/hibert-ranker@finetuned); default: as the model was trained")
    p.add_argument("--field", default="text", help="JSONL field holding the document text")
    p.add_argument("--k", type=int, default=None, help="sentences to extract (default: the model's)")
    p.add_argument("--limit", type=int, default=None, help="summarize at most N documents of a JSONL input")
    p.add_argument("--json", action="store_true", help="print one JSON object per document")

    add_generation_arguments(p)


def _summarize_clusters(cfg: Config, args: argparse.Namespace, local: Path, inputs, device: str, gen) -> int:
    """`gen`: the export's generation settings with the flags on top (checked before any weights load)."""

    ranking = args.ranking or load_mds(local, "cpu")[1]["mds"].ranking
    ranker_dir = None
    if ranking not in RANKINGS:
        ranker_dir = resolve_model(ranking, tracking_uri(cfg.tracking.uri, cfg.run.output_dir), cfg.run_dir / "summarize-ranker")
    summarizer = ClusterSummarizer(local, device, cfg.data.segmenter.stanza_dir, lambda base: gen, ranking, ranker_dir)
    for s in summarizer.summarize_all(inputs):
        if args.json:
            print(json.dumps({"id": s.doc_id, "summary": s.sentences, "num_sentences": s.num_sentences, "note": s.note,
                              **({} if s.subwords is None else {"subwords": s.subwords})}))
        else:
            print(f"# {s.doc_id}: {len(s.sentences)}-sentence abstract of a cluster ({s.note})")
            print("\n".join(s.sentences) if s.sentences else "(no summary: the cluster has no sentences)"
                  if not s.num_sentences else "(empty summary: the model ended it at once)")
    return 0


def run_summarize(cfg: Config, args: argparse.Namespace) -> int:



    try:  # decoding flags that cannot work fail first, on one line naming the flag
        check_generation_flags(args)
    except DecodingFlagError as e:
        print(f"hibert summarize: {e}", file=sys.stderr)
        return 2
    ref = _model_ref(cfg, args.model)
    sources = args.input or ["-"]
    try:
        local = resolve_model(ref, tracking_uri(cfg.tracking.uri, cfg.run.output_dir), cfg.run_dir / "summarize-model")
    except (FileNotFoundError, ValueError) as e:
        local, load_error = None, e
    clusters = local is not None and is_mds_export(local)
    try:  # every input problem is reported before the (slow) model load
        if clusters:
            inputs = list(read_clusters(sources, args.field, args.limit))
        elif len(sources) > 1:
            raise InputError(f"{len(sources)} inputs: several files make one cluster, which needs a multi-document "
                             "(mds) model")
        else:
            inputs = list(read_documents(sources[0], args.field, args.limit))
    except InputError as e:
        print(f"hibert summarize: {e}", file=sys.stderr)
        return 2
    gen = None
    try:
        if local is None:
            raise load_error
        if is_abstractive_export(local):  # (mds exports too) the flags against the model's settings: still no weights
            gen = generation_for_export(local, args)
        if clusters:
            return _summarize_clusters(cfg, args, local, inputs, "cuda" if torch.cuda.is_available() else "cpu", gen)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if gen is not None:
            abstractive = AbstractiveSummarizer(local, device, cfg.data.segmenter.stanza_dir, lambda base: gen)
            summaries = iter(abstractive.summarize_all(inputs))
            summarizer = lambda doc_id, text, k: next(summaries)  # noqa: E731 (decoded in batches above)
        else:
            summarizer = Summarizer(local, device, cfg.data.segmenter.stanza_dir)
    except DecodingFlagError as e:
        print(f"hibert summarize: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        print(f"hibert summarize: cannot load model {ref!r}: {e}", file=sys.stderr)
        return 2
    try:
        for doc_id, text in inputs:
            s = summarizer(doc_id, text, args.k)
            if args.json:
                print(json.dumps({"id": s.doc_id, "summary": s.sentences, "indices": s.indices,
                                  "num_sentences": s.num_sentences, "note": s.note,
                                  **({} if s.subwords is None else {"subwords": s.subwords})}))
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
