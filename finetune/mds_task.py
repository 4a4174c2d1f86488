"""Abstractive multi-document summarization (Liu & Lapata 2019's hierarchical transformer on HIBERT) as a Task
on the one runtime. It is the abstractive head with another encoder side: the units of a cluster, ranked and
cut to `mds.budget_tokens` (finetune/mds_data.py), are encoded by HIBERT (local layers), mixed across units by
the global layers (optionally graph-informed or structural), and read by the same decoder, generator, loss,
two optimizer groups (the pretrained encoder at `finetune.encoder_lr_scale`; global layers and decoder at
optimizer.lr), validation ROUGE and export as `AbstractiveTask`. Registered as `hibert-mds`."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from finetune.abstractive_task import AbstractiveTask
from hibert.config import Config
from hibert.runtime.task import LoaderItem

MDS_CONFIG = "mds.json"
log = logging.getLogger("hibert")


def cluster_graphs(view, rows: list[int], threshold: float) -> list[np.ndarray]:
    """Liu & Lapata eq. 24's unit graph of each selected cluster: tf-idf cosine between its units."""
    from modeling.clusters import unit_graph

    return [unit_graph([np.concatenate(u) if u else np.zeros(0, np.int64) for u in view.units(i)], threshold)
            for i in rows]


class MDSTask(AbstractiveTask):
    name = "mds"

    def registry_name(self, cfg: Config) -> str:
        return "hibert-mds"

    def new_model(self) -> torch.nn.Module:
        from modeling.mds import HibertMDS

        return HibertMDS(self.model_cfg, self.cfg.decoder, self.cfg.mds)

    # ---------------------------------------------------------------- data
    def make_item(self, dataset, doc_indices: np.ndarray, epoch: int) -> LoaderItem:
        from finetune.abstractive_data import target_ids
        from modeling import flops_per_batch
        from modeling.mds import make_mds_batch

        rows = doc_indices.tolist()
        clusters, targets = [], []
        for i in rows:
            summary = dataset.summary(i)
            if summary is None:
                raise ValueError(f"{dataset.split} cluster {dataset.doc_id(i)} has no summary")
            clusters.append(dataset.units(i))
            targets.append(target_ids(summary, self.cfg.finetune.max_target_tokens))
        graphs = cluster_graphs(dataset, rows, self.cfg.mds.graph_threshold) if self.cfg.mds.graph_attention else None
        batch = make_mds_batch(clusters, targets, graphs)
        sent_lens = [len(s) + 1 for c in clusters for u in c for s in u]
        unit_lens = [len(u) for c in clusters for u in c]
        target_lens = [len(t) + 1 for t in targets]
        # local encoder + decoder FLOPs (global layers and cross-attention not counted: MFU is a lower bound)
        flops = flops_per_batch(self.model_cfg, sent_lens, unit_lens, target_lens, backward=True)
        return LoaderItem(batch, real_tokens=sum(sent_lens) + sum(target_lens), flops=flops, num_docs=len(rows),
                          extra={"doc_indices": rows})

    # ---------------------------------------------------------------- evaluation
    def decode_rouge(self, state: dict[str, torch.Tensor], data, device: torch.device) -> dict[str, float]:
        from finetune.abstractive_inference import Decoder
        from finetune.rouge_eval import Rouge

        model = self.new_model()
        model.load_state_dict(state)
        decoder = Decoder(model.to(device).eval(), data.tokenizer_path, self.cfg.generation, device, clusters=True)
        n = min(len(data), self.cfg.finetune.eval_decode_docs)
        idx = list(range(n))
        graphs = cluster_graphs(data, idx, self.cfg.mds.graph_threshold) if self.cfg.mds.graph_attention else None
        summaries = decoder.summarize_ids([data.units(i) for i in idx], graphs=graphs)
        refs = [[data.summary_text(i)] for i in idx]
        per_doc = Rouge(("rouge1", "rouge2", "rougeL")).score_corpus([s.sentences for s in summaries], refs)
        r = {m: float(v.mean()) for m, v in per_doc.items()}
        return {"valid_rouge1": r["rouge1_f"], "valid_rouge2": r["rouge2_f"], "valid_rougeL": r["rougeL_f"],
                "valid_rouge": (r["rouge1_f"] + r["rouge2_f"] + r["rougeL_f"]) / 3,
                "valid_summary_words": float(np.mean([len(" ".join(s.sentences).split()) for s in summaries]))}

    # ---------------------------------------------------------------- export
    def write_export_extras(self, out_dir, full_state: dict[str, torch.Tensor]) -> None:
        super().write_export_extras(out_dir, full_state)
        (Path(out_dir) / MDS_CONFIG).write_text(json.dumps({"mds": trained_mds_settings(self.cfg)}, indent=1))


def trained_mds_settings(cfg: Config) -> dict:
    """`cfg.mds` as the run read it: a learned ranker's alias replaced by the version that ranked the training
    split, so evaluate and summarize rank with that ranker even after the alias moves."""
    settings = cfg.mds.model_dump(mode="json")
    cache = cfg.run_dir / "rankings" / "train.npz"
    if settings["ranking"].startswith("models:/") and cache.is_file() and _cached_ranker(cache) == settings["ranking"]:
        settings["ranking"] = _cached_ranker(cache, "pinned")
    return settings


# -------------------------------------------------------------------------------------------- ranking
def ranked_view(cfg: Config, dataset, rt=None, run_dir: Path | None = None, reuse: bool = False):
    """`dataset` (a cluster split) ranked by `mds.ranking` and cut to `mds.budget_tokens` / `mds.top_units` /
    `mds.max_units`. A learned ranker (`models:/hibert-ranker@...` or an export dir) scores the split once on
    rank 0; the scores are written to <run dir>/rankings/ and read by every rank. `reuse` (training): scores
    already written by this run for the same ranker reference are read back, so a resumed run ranks exactly
    as it started even if the registry alias has moved since, and does not rescore the split."""
    from finetune.mds_data import RANKINGS, RankedClusters

    m = cfg.mds
    common = {"budget": m.budget_tokens, "top": m.top_units, "max_units": m.max_units}
    if m.ranking in RANKINGS:
        return RankedClusters(dataset, m.ranking, **common)
    run_dir = run_dir or cfg.run_dir
    path = run_dir / "rankings" / f"{dataset.split}.npz"
    is_main = rt is None or rt.is_main
    cached = reuse and path.is_file() and _cached_ranker(path) == m.ranking
    if is_main and cached:
        log.info("reusing the %s rankings this run computed at its start (%s)", dataset.split, path)
    if is_main and not cached:
        scores, pinned = learned_scores(cfg, dataset, m.ranking, run_dir, rt.device if rt is not None else "cpu")
        path.parent.mkdir(parents=True, exist_ok=True)
        flat = np.concatenate(scores) if scores else np.zeros(0, np.float32)
        np.savez(path, scores=flat, counts=np.array([len(s) for s in scores], np.int64), ranker=np.array(m.ranking),
                 pinned=np.array(pinned))
    if rt is not None and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()
    with np.load(path, allow_pickle=False) as z:
        scores = np.split(z["scores"], np.cumsum(z["counts"])[:-1]) if len(z["counts"]) else []
    return RankedClusters(dataset, scores=scores, **common)


def _cached_ranker(path: Path, field: str = "ranker") -> str:
    with np.load(path, allow_pickle=False) as z:
        return str(z[field]) if field in z else str(z["ranker"])


def learned_scores(cfg: Config, dataset, ref: str, run_dir: Path, device) -> tuple[list[np.ndarray], str]:
    """A learned ranker's scores for every unit of every cluster of `dataset` that has a summary, and the
    ranker read (an alias pinned to its version: models:/hibert-ranker/3)."""
    from finetune.ranker_task import all_units_view, load_ranker, score_clusters
    from hibert.registry import pin_model_ref, resolve_model, tracking_uri

    uri = tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    pinned = pin_model_ref(ref, uri)
    model, meta = load_ranker(resolve_model(pinned, uri, run_dir / "ranker"), device)
    view = all_units_view(dataset)
    log.info("ranking %d %s clusters with %s (%s)", len(view), dataset.split, ref, pinned)
    return score_clusters(model, [view.units(i) for i in range(len(view))], device), pinned
