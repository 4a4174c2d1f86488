"""The paragraph ranker of Liu & Lapata 2019 (§3) on HIBERT, as a Task on the one runtime: the registered
encoder reads every unit of a cluster, a pooled vector per unit goes through a linear head, and the scores
are trained against each unit's ROUGE-2 recall of the target summary (listwise within the cluster, or a
regression). Validation: the loss, and the ROUGE-L recall of the top L' = 5 units (Liu & Lapata's Table 1
measure) on the first `finetune.eval_decode_docs` clusters, which drives model selection. Exported as
encoder.safetensors + ranker.safetensors + ranker.json; registered as `hibert-ranker`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import Tensor

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.finetune.base.clusters import rank_order, tfidf_scores
from hibert.finetune.base.task import EncoderHead, encoder_and_head_groups
from hibert.finetune.ranker.export import RANKER_CONFIG, RANKER_WEIGHTS, score_clusters
from hibert.finetune.ranker.metrics import ranking_table
from hibert.modeling import flops_per_batch
from hibert.modeling.packing import TensorBundle
from hibert.modeling.ranker import HibertRanker, RankerInput, ranker_input, ranker_loss
from hibert.runtime.export import gather_fp32_state_dict
from hibert.runtime.task import EvalContext, LoaderItem, ParamGroup, Task


@dataclass
class RankerBatch(TensorBundle):
    inp: RankerInput          # the units, where each sits (the loss groups by cluster), the clusters' titles
    labels: Tensor            # [U] ROUGE-2 recall of every unit (cluster-major, as packed)


class RankerTask(EncoderHead, Task):
    name = "ranker"
    eval_metric = "valid_recall5"
    eval_mode = "max"
    stat_keys = ("loss_sum", "clusters")

    def __init__(self, cfg: Config, model_cfg: ModelConfig):
        self.cfg, self.model_cfg = cfg, model_cfg

    def new_model(self) -> torch.nn.Module:
        return HibertRanker(self.model_cfg, self.cfg.mds.ranker_pool)

    def build_model(self) -> torch.nn.Module:
        return self.new_model()

    def param_groups(self, model: torch.nn.Module, cfg: Config) -> list[ParamGroup]:
        return encoder_and_head_groups(model, cfg, "head.")

    # ---------------------------------------------------------------- data
    def make_item(self, dataset, doc_indices: np.ndarray, epoch: int) -> LoaderItem:
        clusters, labels, titles = [], [], []
        for i in doc_indices.tolist():
            units = dataset.units(i)
            scores = dataset.unit_scores(i)
            if scores is None:
                raise ValueError(f"{dataset.split} cluster {dataset.doc_id(i)} has no summary: the ranker needs "
                                 "ROUGE-2 recall labels")
            clusters.append(units)
            titles.append(dataset.title_ids(i))
            labels.append(np.asarray(scores, dtype=np.float32)[dataset.order(i)])
        inp = ranker_input(clusters, titles)
        batch = RankerBatch(inp, torch.from_numpy(np.concatenate(labels)))
        sent_lens = [len(s) + 1 for c in clusters for u in c for s in u]
        unit_lens = [len(u) for c in clusters for u in c]
        flops = flops_per_batch(self.model_cfg, sent_lens, unit_lens, [], backward=True)
        return LoaderItem(batch, real_tokens=sum(sent_lens), flops=flops, num_docs=len(clusters))

    def loss(self, engine, item: LoaderItem):
        batch: RankerBatch = item.batch
        scores = engine(batch.inp)
        loss, counted = ranker_loss(scores.float(), batch.labels, batch.inp.layout, self.cfg.mds.ranker_loss)
        n = torch.as_tensor(float(counted), dtype=torch.float64)
        return loss, {"loss_sum": loss.detach().double() * n, "clusters": n}

    def summarize(self, sums: dict[str, float], prefix: str) -> dict[str, float]:
        n = sums.get("clusters", 0.0)
        return {f"{prefix}loss": sums["loss_sum"] / n} if n > 0 else {}

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        metrics = super().evaluate(ctx)
        full = gather_fp32_state_dict(ctx.engine.module, "")
        box = [None]
        if ctx.is_main:
            box = [self.selection_metrics(full, ctx.valid_data, ctx.device)]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(box, src=0)
        return {**metrics, **box[0]}

    def selection_metrics(self, state: dict[str, Tensor], data, device: torch.device) -> dict[str, float]:
        """ROUGE-L recall of the top 5 units by the model and by tf-idf on the first clusters of `data`."""
        model = self.new_model()
        model.load_state_dict(state)
        n = min(len(data), self.cfg.finetune.eval_decode_docs)
        scores = score_clusters(model.to(device).eval(), [data.units(i) for i in range(n)], device,
                                [data.title_ids(i) for i in range(n)])
        texts = [data.units_text(i) for i in range(n)]
        orders = {"model": [rank_order(s) for s in scores],
                  "tfidf": [rank_order(tfidf_scores([" ".join(u) for u in t], data.title(i)))
                            for i, t in enumerate(texts)]}
        table = ranking_table(texts, [data.summary_text(i) for i in range(n)], orders, cutoffs=(5,))
        return {"valid_recall5": float(table["model"][5].mean()), "valid_tfidf_recall5": float(table["tfidf"][5].mean())}

    # ---------------------------------------------------------------- export
    def write_export_extras(self, out_dir, full_state: dict[str, Tensor]) -> None:
        head = {k: v.contiguous() for k, v in full_state.items() if not k.startswith("encoder.")}
        save_file(head, str(Path(out_dir) / RANKER_WEIGHTS))
        (Path(out_dir) / RANKER_CONFIG).write_text(json.dumps({"mds": self.cfg.mds.model_dump(mode="json")}, indent=1))
