"""`hibert evaluate` and `hibert summarize` for abstractive models: decoding flags, the report (ROUGE with CIs
next to Lead-3 and the oracle, paired bootstrap against Lead-3 and any other run's report, novel n-gram
rates, length and repetition), and raw text -> abstract."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("hibert.evaluate")


def _bounded(kind, low):
    def parse(text: str):
        value = kind(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return value
    return parse


def add_generation_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding (abstractive models; default: the model's generation.json)")
    g.add_argument("--beam", type=_bounded(int, 1), default=None, help="beam size (1 = greedy)")
    g.add_argument("--min-len", type=_bounded(int, 0), default=None, help="minimum summary length in subwords")
    g.add_argument("--max-len", type=_bounded(int, 1), default=None, help="maximum summary length in subwords")
    g.add_argument("--length-penalty", type=_bounded(float, 0.0), default=None, help="GNMT length penalty alpha")
    g.add_argument("--no-repeat-ngram", type=_bounded(int, 0), default=None,
                   help="block repeated word n-grams (0 = off)")
    g.add_argument("--max-word-pieces", type=_bounded(int, 0), default=None,
                   help="at most this many subwords per word (0 = no cap)")
    g.add_argument("--batch-size", type=_bounded(int, 1), default=None, help="documents decoded together")


def generation_from_args(base, args: argparse.Namespace):
    """The export's generation settings with the command line's flags on top (validated by the schema)."""
    changes = {k: v for k, v in {"beam_size": args.beam, "min_length": args.min_len, "max_length": args.max_len,
                                 "length_penalty": args.length_penalty, "no_repeat_ngram": args.no_repeat_ngram,
                                 "max_word_pieces": args.max_word_pieces, "batch_size": args.batch_size}.items() if v is not None}
    return type(base).model_validate({**base.model_dump(), **changes})


def is_abstractive_export(local: Path) -> bool:
    from finetune.abstractive_task import DECODER_CONFIG

    return (Path(local) / DECODER_CONFIG).is_file()


def compared_reports(paths: list[str], split: str) -> dict[str, dict[str, Any]]:
    """`--compare NAME=PATH`: another run's report (report.json, its directory, or a run dir holding
    report-<split>/report.json) whose per-document model scores are paired with this model's."""
    out: dict[str, dict[str, Any]] = {}
    for item in paths:
        name, _, path = item.rpartition("=")
        p = Path(path)
        for cand in (p, p / "report.json", p / f"report-{split}" / "report.json"):
            if cand.is_file():
                report = json.loads(cand.read_text())
                out[name or cand.parent.parent.name] = report
                break
        else:
            raise SystemExit(f"hibert: report {item!r}: no report.json there (run `hibert evaluate` for that run "
                             "first)")
    return out


def pair_with_reports(result: dict[str, Any], reports: dict[str, dict[str, Any]], n_resamples: int) -> None:
    """Add `model-<name>` paired differences against other runs' per-document scores (same documents)."""
    import numpy as np

    from finetune.evaluation import HEADLINE
    from finetune.rouge_eval import paired_bootstrap

    ours = dict(zip(result["doc_ids"], range(len(result["doc_ids"]))))
    for name, rep in reports.items():
        theirs = rep.get("per_document", {})
        ids = theirs.get("doc_ids", [])
        common = [d for d in ids if d in ours]
        if not common or "model" not in theirs:
            raise SystemExit(f"hibert evaluate: --compare {name}: its report shares no documents with this one")
        if len(common) != len(ours):
            log.warning("--compare %s: paired over the %d documents both reports hold (of %d)", name, len(common),
                        len(ours))
        a_idx = [ours[d] for d in common]
        b_idx = [ids.index(d) for d in common]
        result["paired"][f"model-{name}"] = {
            m: paired_bootstrap(np.asarray(result["per_document"]["model"][m])[a_idx] * 1.0,
                                np.asarray(theirs["model"][m])[b_idx] * 1.0, n_resamples)
            for m in HEADLINE}


def evaluate_abstractive(cfg, args: argparse.Namespace, local: Path, ref: str, uri: str) -> dict[str, Any]:
    """Decode a split with an abstractive export and write the report; returns what the CLI prints."""
    import torch

    from data_prep import DocumentDataset
    from finetune.abstractive_data import FirstChunks
    from finetune.abstractive_inference import Decoder, load_abstractive
    from finetune.abstractive_metrics import abstractiveness
    from finetune.evaluation import baseline_systems, documents, score_systems, write_report
    from hibert.redact import redact_uri
    from pretrain.trainer import file_hash

    device = "cuda" if torch.cuda.is_available() else "cpu"
    reports = compared_reports(args.compare, args.split)   # bad --compare fails before any decoding
    model, meta = load_abstractive(local, device)
    gen = generation_from_args(meta["generation"], args)
    test = DocumentDataset(cfg.data.dataset_dir, args.split)
    view = FirstChunks(test)
    if len(view) == 0:
        raise SystemExit(f"hibert evaluate: split {args.split!r} of {cfg.data.dataset_dir} has no documents "
                         "with summaries")
    docs = documents(test)                  # whole documents: Lead-3, the oracle and novelty see all of them
    first = {view.source_doc(i): i for i in range(len(view))}
    docs = [d for d in docs if d.doc_id in first]
    if args.limit:
        docs = docs[: args.limit]
    decoder = Decoder(model, test.tokenizer_path, gen, device)
    decoded = decoder.summarize_ids([view[first[d.doc_id]] for d in docs])
    systems = {"model": [x.sentences for x in decoded], **baseline_systems(docs)}
    result = score_systems(docs, systems, n_resamples=args.bootstrap)
    pair_with_reports(result, reports, args.bootstrap)
    sources = [d.sentences for d in docs]
    result["abstractiveness"] = {name: abstractiveness(s, sources) for name, s in systems.items()}
    manifest = Path(cfg.data.dataset_dir) / "manifest.json"
    report_meta = {"task": "abstractive", "model": redact_uri(ref), "encoder_init": meta.get("init"),
                   "dataset": str(cfg.data.dataset_dir), "split": args.split,
                   "generation": gen.model_dump(), "reads": "the first chunk of each document "
                   f"(<= {model.encoder.cfg.max_positions} positions; data.max_doc_sentences sentences)",
                   "lead3": "the first 3 sentences", "compared_with": sorted(reports),
                   "dataset_manifest": file_hash(manifest) if manifest.is_file() else "none",
                   "finetune_run": meta.get("mlflow_run_id")}
    out = Path(args.out) if args.out else cfg.run_dir / f"report-{args.split}"
    paths = write_report(out, result, docs, report_meta)
    return {"result": result, "paths": paths, "meta": report_meta, "out": out}
