"""Abstractive multi-document summarization (Liu & Lapata 2019's hierarchical transformer on HIBERT) as a Task
on the one runtime. It is the abstractive head with another encoder side: the units of a cluster, ranked and
cut to `mds.budget_tokens` (finetune/base/clusters.py), are encoded by HIBERT (local layers), mixed across units by
the global layers (optionally graph-informed or structural), and read by the same decoder, generator, loss,
two optimizer groups (the pretrained encoder at `finetune.encoder_lr_scale`; global layers and decoder at
optimizer.lr), validation ROUGE and export as `AbstractiveTask`. Registered as `hibert-mds`."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from hibert.finetune.abstractive.data import make_mds_batch, target_ids
from hibert.finetune.abstractive.task import AbstractiveTask
from hibert.finetune.base.clusters import cluster_graphs
from hibert.finetune.mds.export import MDS_CONFIG
from hibert.finetune.ranker.ranking import trained_mds_settings
from hibert.modeling import flops_per_batch
from hibert.modeling.mds import HibertMDS
from hibert.runtime.task import LoaderItem


class MDSTask(AbstractiveTask):
    name = "mds"


    def new_model(self) -> torch.nn.Module:
        return HibertMDS(self.model_cfg, self.cfg.decoder, self.cfg.mds)

    # ---------------------------------------------------------------- data
    def make_item(self, dataset, doc_indices: np.ndarray, epoch: int) -> LoaderItem:
        rows = doc_indices.tolist()
        clusters, targets = [], []
        for i in rows:
            summary = dataset.summary(i)
            if summary is None:
                raise ValueError(f"{dataset.split} cluster {dataset.doc_id(i)} has no summary")
            clusters.append(dataset.units(i))
            targets.append(target_ids(summary, self.cfg.finetune.max_target_tokens))
        graphs = cluster_graphs(dataset, rows, self.cfg.mds) if self.cfg.mds.graph_attention else None
        batch = make_mds_batch(clusters, targets, graphs)
        sent_lens = [len(s) + 1 for c in clusters for u in c for s in u]
        unit_lens = [len(u) for c in clusters for u in c]
        target_lens = [len(t) + 1 for t in targets]
        # local encoder + decoder FLOPs (global layers and cross-attention not counted: MFU is a lower bound)
        flops = flops_per_batch(self.model_cfg, sent_lens, unit_lens, target_lens, backward=True)
        return LoaderItem(batch, real_tokens=sum(sent_lens) + sum(target_lens), flops=flops, num_docs=len(rows),
                          extra={"doc_indices": rows})

    # ---------------------------------------------------------------- evaluation
    clusters = True

    def decode_inputs(self, data, idx: list[int]) -> tuple[list, list[np.ndarray] | None]:
        graphs = cluster_graphs(data, idx, self.cfg.mds) if self.cfg.mds.graph_attention else None
        return [data.units(i) for i in idx], graphs

    # ---------------------------------------------------------------- export
    def write_export_extras(self, out_dir, full_state: dict[str, torch.Tensor]) -> None:
        super().write_export_extras(out_dir, full_state)
        (Path(out_dir) / MDS_CONFIG).write_text(json.dumps({"mds": trained_mds_settings(self.cfg)}, indent=1))
