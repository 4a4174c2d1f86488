"""`hibert evaluate` for the ranker: its ROUGE-L recall of the top L' units next to tf-idf, document order
and the label oracle (Liu & Lapata's Table 1), with paired bootstrap. Reports on synthetic clusters say so."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hibert.config import Config
from hibert.data_prep import DocumentDataset
from hibert.errors import UserError
from hibert.finetune.base.clusters import all_units_view, data_note, rank_order, tfidf_scores
from hibert.finetune.base.rouge import bootstrap_ci, format_p, paired_bootstrap
from hibert.finetune.base.settings import EvalSettings
from hibert.finetune.ranker.export import load_ranker, score_clusters
from hibert.finetune.ranker.metrics import CUTOFFS, ranking_table
from hibert.hashing import file_hash
from hibert.redact import redact_uri

log = logging.getLogger("hibert.evaluate")


def evaluate_ranker(cfg: Config, args: EvalSettings, local: Path, ref: str) -> dict[str, Any]:
    """ROUGE-L recall of the top L' units: the learned ranker vs tf-idf, document order and the oracle."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, meta = load_ranker(local, device)
    test = DocumentDataset(cfg.data.dataset_dir, args.split)
    view = all_units_view(test)
    n = len(view) if not args.limit else min(args.limit, len(view))
    if n == 0:
        raise UserError(f"hibert evaluate: split {args.split!r} of {cfg.data.dataset_dir} has no clusters with "
                         "summaries")
    texts = [view.units_text(k) for k in range(n)]
    scores = score_clusters(model, [view.units(k) for k in range(n)], device, [view.title_ids(k) for k in range(n)])
    orders = {"ranker": [rank_order(s) for s in scores],
              "tfidf": [rank_order(tfidf_scores([" ".join(u) for u in t], view.title(k))) for k, t in enumerate(texts)],
              "document_order": [np.arange(len(t)) for t in texts],
              "oracle": [rank_order(view.unit_scores(k)) for k in range(n)]}
    table = ranking_table(texts, [view.summary_text(k) for k in range(n)], orders)
    rows = {name: {str(c): {"mean": float(v.mean()), **dict(zip(("low", "high"), bootstrap_ci(v, args.bootstrap)))}
                   for c, v in by_cut.items()} for name, by_cut in table.items()}
    paired = {f"ranker-{other}": {str(c): paired_bootstrap(table["ranker"][c], table[other][c], args.bootstrap)
                                  for c in CUTOFFS} for other in ("tfidf", "document_order")}
    manifest = Path(cfg.data.dataset_dir) / "manifest.json"
    # "clusters" is data_note's real / synthetic; the count is num_clusters
    report_meta = {"task": "ranker", **data_note(test), "model": redact_uri(ref), "encoder_init": meta.get("init"),
                   "dataset": str(cfg.data.dataset_dir), "split": args.split, "num_clusters": n,
                   "dataset_manifest": file_hash(manifest) if manifest.is_file() else "none",
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
