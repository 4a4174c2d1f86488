"""`hibert evaluate` on a cluster dataset: the multi-document summarizer (or a flat abstractive model reading
the ranked units back to back) next to Lead (first sentences of the first document; first words to the gold
length, in document order and — Liu & Lapata's definition — of the title and the ranked units) and a tf-idf
centroid extract, with CIs and paired bootstrap; and the
learned ranker's ROUGE-L recall of the top L' units next to tf-idf, document order and the label oracle
(Liu & Lapata's Table 1). Reports on synthetic clusters say so in their title and meta."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from finetune.evaluation import Document

log = logging.getLogger("hibert.evaluate")
ORACLE_NOTE = " — the oracle reads the references: an upper bound, not a result"
SYNTHETIC_NOTE = ("SYNTHETIC clusters: single-document news articles grouped with their tf-idf nearest neighbours "
                  "(not real multi-document topics)")


def data_note(dataset) -> dict[str, Any]:
    m = dataset.manifest
    out = {"clusters": "synthetic" if m.get("synthetic") else "real"}
    if m.get("synthetic"):
        out["note"] = SYNTHETIC_NOTE
    return out


def ranked_sentences(view, k: int) -> list[str]:
    """Cluster k's title (if any) then its units in the view's rank order, as sentences."""
    title = view.title(k)
    return ([title] if title else []) + view.sentences_text(k)


def cluster_document(view, k: int) -> tuple[Document, list[int]]:
    """Cluster k of a view as a `Document` (every sentence, documents in order) and each sentence's document."""
    base, row = view.base, int(view.rows[k])
    units = base.units_text(row)
    unit_docs = np.asarray(base.unit_docs(row)).tolist()
    sents = [s for u in units for s in u]
    sent_doc = [d for u, d in zip(units, unit_docs) for _ in u]
    return Document(base.doc_id(row), sents, [base.summary_text(row)], None), sent_doc


def evaluate_clusters(cfg, args: argparse.Namespace, local: Path, ref: str, mds: bool) -> dict[str, Any]:
    """Decode a split of clusters with an mds export (or a flat abstractive export) and write the report."""
    import torch

    from data_prep import DocumentDataset
    from finetune.abstractive_eval import compared_reports, generation_from_args, pair_with_reports
    from finetune.abstractive_inference import Decoder, load_abstractive
    from finetune.abstractive_metrics import abstractiveness
    from finetune.evaluation import score_systems, write_report
    from finetune.mds_inference import lead_first_document, lead_tokens, load_mds, tfidf_extract
    from finetune.mds_task import cluster_graphs, ranked_view
    from hibert.redact import redact_uri
    from hibert.hashing import file_hash

    device = "cuda" if torch.cuda.is_available() else "cpu"
    reports = compared_reports(args.compare, args.split)
    model, meta = (load_mds if mds else load_abstractive)(local, device)
    gen = generation_from_args(meta["generation"], args)
    if mds:  # the model reads units as it was trained to: its ranking, budget and unit cap
        cfg.mds = meta["mds"]
    elif meta["decoder"].get("mds"):  # a flat baseline trained on clusters records the same settings
        from hibert.config.mds import MDSConfig

        cfg.mds = MDSConfig.model_validate(meta["decoder"]["mds"])
    trained_budget = cfg.mds.budget_tokens
    if getattr(args, "ranking", None):  # e.g. the learned ranker at test time, or tfidf for an ablation
        cfg.mds = cfg.mds.model_copy(update={"ranking": args.ranking})
    if getattr(args, "budget_tokens", None):  # Liu & Lapata's test: trained on 800 tokens, read 1,600
        cfg.mds = cfg.mds.model_copy(update={"budget_tokens": args.budget_tokens})
    if cfg.mds.ranking == "oracle" and getattr(args, "ranking", None) != "oracle":
        # the oracle ranks units by ROUGE against the very summaries being scored
        raise SystemExit("hibert evaluate: this model ranks units with the oracle, which reads the reference "
                         "summaries of the split it scores; pass --ranking tfidf|lead|models:/hibert-ranker@..., "
                         "or --ranking oracle for an upper bound (labelled so in the report)")
    test = DocumentDataset(cfg.data.dataset_dir, args.split)
    view = ranked_view(cfg, test, None, Path(args.out) if args.out else cfg.run_dir / f"report-{args.split}")
    n = len(view) if not args.limit else min(args.limit, len(view))
    if n == 0:
        raise SystemExit(f"hibert evaluate: split {args.split!r} of {cfg.data.dataset_dir} has no clusters with "
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


def evaluate_ranker(cfg, args: argparse.Namespace, local: Path, ref: str) -> dict[str, Any]:
    """ROUGE-L recall of the top L' units: the learned ranker vs tf-idf, document order and the oracle."""
    import torch

    from data_prep import DocumentDataset
    from finetune.mds_data import rank_order, tfidf_scores
    from finetune.ranker_eval import CUTOFFS, ranking_table
    from finetune.ranker_task import all_units_view, load_ranker, score_clusters
    from finetune.rouge_eval import bootstrap_ci, format_p, paired_bootstrap
    from hibert.redact import redact_uri

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, meta = load_ranker(local, device)
    test = DocumentDataset(cfg.data.dataset_dir, args.split)
    view = all_units_view(test)
    n = len(view) if not args.limit else min(args.limit, len(view))
    if n == 0:
        raise SystemExit(f"hibert evaluate: split {args.split!r} of {cfg.data.dataset_dir} has no clusters with "
                         "summaries")
    texts = [view.units_text(k) for k in range(n)]
    scores = score_clusters(model, [view.units(k) for k in range(n)], device)
    orders = {"ranker": [rank_order(s) for s in scores],
              "tfidf": [rank_order(tfidf_scores([" ".join(u) for u in t], view.title(k))) for k, t in enumerate(texts)],
              "document_order": [np.arange(len(t)) for t in texts],
              "oracle": [rank_order(view.unit_scores(k)) for k in range(n)]}
    table = ranking_table(texts, [view.summary_text(k) for k in range(n)], orders)
    rows = {name: {str(c): {"mean": float(v.mean()), **dict(zip(("low", "high"), bootstrap_ci(v, args.bootstrap)))}
                   for c, v in by_cut.items()} for name, by_cut in table.items()}
    paired = {f"ranker-{other}": {str(c): paired_bootstrap(table["ranker"][c], table[other][c], args.bootstrap)
                                  for c in CUTOFFS} for other in ("tfidf", "document_order")}
    report_meta = {"task": "ranker", **data_note(test), "model": redact_uri(ref), "encoder_init": meta.get("init"),
                   "dataset": str(cfg.data.dataset_dir), "split": args.split, "clusters": n,
                   "measure": "ROUGE-L recall (rouge-score, stemmed, x100) of the top L' units concatenated "
                              "against the reference (Liu & Lapata 2019, Table 1)",
                   "units_per_cluster": float(np.mean([len(t) for t in texts]))}
    out = Path(args.out) if args.out else cfg.run_dir / f"report-{args.split}"
    out.mkdir(parents=True, exist_ok=True)
    payload = {"meta": report_meta, "recall": rows, "paired": paired,
               "per_cluster": {"doc_ids": [view.doc_id(k) for k in range(n)],
                               **{name: {str(c): v.round(4).tolist() for c, v in by_cut.items()}
                                  for name, by_cut in table.items()}}}
    (out / "report.json").write_text(json.dumps(payload, indent=1))
    title = "# Unit ranking report" + (" (SYNTHETIC clusters)" if test.manifest.get("synthetic") else "")
    lines = [title, "", *[f"- {k}: {v}" for k, v in report_meta.items()], "",
             "| ranking | " + " | ".join(f"L'={c}" for c in CUTOFFS) + " |", "|---|" + "---|" * len(CUTOFFS)]
    for name, by_cut in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{by_cut[str(c)]['mean']:.2f} [{by_cut[str(c)]['low']:.2f}, "
                                                 f"{by_cut[str(c)]['high']:.2f}]" for c in CUTOFFS) + " |")
    lines += ["", "Paired bootstrap (difference of ROUGE-L recall, 95% CI, two-sided p):", "",
              "| pair | " + " | ".join(f"L'={c}" for c in CUTOFFS) + " |", "|---|" + "---|" * len(CUTOFFS)]
    for pair, by_cut in paired.items():
        cells = [f"{d['diff']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] " + format_p(d["p_value"], d["resamples"])
                 for d in by_cut.values()]
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return {"payload": payload, "out": out, "meta": report_meta}
