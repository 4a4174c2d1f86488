"""`hibert evaluate` for decoders: an abstractive export on documents (the first chunk of each; ROUGE with
CIs next to Lead-3 and the oracle, paired bootstrap against any other run's report, novel n-gram rates,
length and repetition), and a decoder on a cluster dataset — the multi-document summarizer, or a flat
abstractive model reading the ranked units back to back — next to Lead (first sentences of the first
document; first words to the gold length, in document order and — Liu & Lapata's definition — of the title
and the ranked units) and a tf-idf centroid extract. Reports on synthetic clusters say so in their title
and meta."""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from data_prep import DocumentDataset
from finetune.abstractive.data import FirstChunks
from finetune.abstractive.export import load_abstractive
from finetune.abstractive.metrics import abstractiveness
from finetune.base.clusters import (
    ORACLE_NOTE,
    cluster_document,
    cluster_graphs,
    data_note,
    lead_first_document,
    lead_tokens,
    ranked_sentences,
    tfidf_extract,
)
from finetune.base.decoding import Decoder
from finetune.base.errors import UserError
from finetune.base.generation import generation_from_args
from finetune.base.report import (
    baseline_systems,
    compared_reports,
    documents,
    pair_with_reports,
    score_systems,
    write_report,
)
from finetune.base.settings import EvalSettings
from finetune.ranker.ranking import ranked_view
from hibert.config import Config
from hibert.config.mds import MDSConfig
from hibert.hashing import file_hash
from hibert.redact import redact_uri

log = logging.getLogger("hibert.evaluate")


def evaluate_abstractive(cfg: Config, args: EvalSettings, local: Path, ref: str) -> dict[str, Any]:
    """Decode a split with an abstractive export and write the report; returns what the CLI prints."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reports = compared_reports(args.compare, args.split)   # bad --compare fails before any decoding
    model, meta = load_abstractive(local, device)
    gen = generation_from_args(meta["generation"], args)
    test = DocumentDataset(cfg.data.dataset_dir, args.split)
    view = FirstChunks(test)
    if len(view) == 0:
        raise UserError(f"hibert evaluate: split {args.split!r} of {cfg.data.dataset_dir} has no documents "
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


def evaluate_clusters(cfg: Config, args: EvalSettings, local: Path, ref: str, load: Callable,
                      mds: bool) -> dict[str, Any]:
    """Decode a split of clusters with an mds export (`mds`; `load` = its loader) or a flat abstractive export,
    and write the report. `cfg` is not changed: the run reads the units with a copy holding the model's own
    `mds:` settings (ranking, budget, unit cap) and the command line's --ranking / --budget-tokens."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reports = compared_reports(args.compare, args.split)
    model, meta = load(local, device)
    gen = generation_from_args(meta["generation"], args)
    mds_cfg = cfg.mds
    if mds:  # the model reads units as it was trained to: its ranking, budget and unit cap
        mds_cfg = meta["mds"]
    elif meta["decoder"].get("mds"):  # a flat baseline trained on clusters records the same settings
        mds_cfg = MDSConfig.model_validate(meta["decoder"]["mds"])
    trained_budget = mds_cfg.budget_tokens
    if args.ranking:  # e.g. the learned ranker at test time, or tfidf for an ablation
        mds_cfg = mds_cfg.model_copy(update={"ranking": args.ranking})
    if args.budget_tokens:  # Liu & Lapata's test: trained on 800 tokens, read 1,600
        mds_cfg = mds_cfg.model_copy(update={"budget_tokens": args.budget_tokens})
    cfg = cfg.model_copy(update={"mds": mds_cfg})
    if cfg.mds.ranking == "oracle" and args.ranking != "oracle":
        # the oracle ranks units by ROUGE against the very summaries being scored
        raise UserError("hibert evaluate: this model ranks units with the oracle, which reads the reference "
                         "summaries of the split it scores; pass --ranking tfidf|lead|models:/hibert-ranker@..., "
                         "or --ranking oracle for an upper bound (labelled so in the report)")
    test = DocumentDataset(cfg.data.dataset_dir, args.split)
    view = ranked_view(cfg, test, None, Path(args.out) if args.out else cfg.run_dir / f"report-{args.split}")
    n = len(view) if not args.limit else min(args.limit, len(view))
    if n == 0:
        raise UserError(f"hibert evaluate: split {args.split!r} of {cfg.data.dataset_dir} has no clusters with "
                         "summaries")
    idx = list(range(n))
    docs, sent_docs = zip(*(cluster_document(view, k) for k in idx))
    docs = list(docs)
    decoder = Decoder(model, test.tokenizer_path, gen, device, clusters=mds)
    if mds:
        graphs = cluster_graphs(view, idx, cfg.mds.graph_threshold) if cfg.mds.graph_attention else None
        decoded = decoder.summarize_ids([view.units(k) for k in idx], graphs=graphs)
    else:
        decoded = decoder.summarize_ids([view[k] for k in idx])
    gold_words = [len(" ".join(d.references[0]).split()) for d in docs]
    systems = {"model": [x.sentences for x in decoded],
               "lead3_first_doc": [lead_first_document(d.sentences, sd, 3) for d, sd in zip(docs, sent_docs)],
               "lead_gold_length": [lead_tokens(d.sentences, g) for d, g in zip(docs, gold_words)],
               "lead_ranked": [lead_tokens(ranked_sentences(view, k), g) for k, g in zip(idx, gold_words)],
               "tfidf_extract": [tfidf_extract(d.sentences, 3) for d in docs]}
    result = score_systems(docs, systems, n_resamples=args.bootstrap)
    pair_with_reports(result, reports, args.bootstrap)
    sources = [d.sentences for d in docs]
    result["abstractiveness"] = {name: abstractiveness(s, sources) for name, s in systems.items()}
    manifest = Path(cfg.data.dataset_dir) / "manifest.json"
    task = "multi-document (mds)" if mds else "multi-document (flat abstractive baseline)"
    if test.manifest.get("synthetic"):
        task += ", SYNTHETIC clusters"
    report_meta = {"task": task,
                   **data_note(test), "model": redact_uri(ref), "encoder_init": meta.get("init"),
                   "dataset": str(cfg.data.dataset_dir), "split": args.split, "generation": gen.model_dump(),
                   "reads": f"units ranked by {cfg.mds.ranking}, <= {cfg.mds.budget_tokens} tokens (trained on "
                            f"{trained_budget})"
                            f"{'' if mds else ', back to back as one document'}"
                            f"{ORACLE_NOTE if cfg.mds.ranking == 'oracle' else ''}",
                   "lead3_first_doc": "the first 3 sentences of the first document",
                   "lead_gold_length": "the first words of the documents back to back (document order), as many as "
                                       "the reference has",
                   "lead_ranked": f"Liu & Lapata's Lead: the title and the units ranked by {cfg.mds.ranking} back "
                                  "to back, cut at the reference's length in words",
                   "tfidf_extract": "3 sentences by tf-idf cosine to the cluster centroid, redundancy-filtered",
                   "compared_with": sorted(reports),
                   "dataset_manifest": file_hash(manifest) if manifest.is_file() else "none",
                   "finetune_run": meta.get("mlflow_run_id")}
    out = Path(args.out) if args.out else cfg.run_dir / f"report-{args.split}"
    paths = write_report(out, result, docs, report_meta)
    return {"result": result, "paths": paths, "meta": report_meta, "out": out}
