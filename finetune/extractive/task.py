"""Extractive summarization as sentence labelling (HIBERT §3.3) on the shared training loop.

Training minimises the NLL of the oracle labels (data_prep's greedy ROUGE oracle). Validation scores
every validation document, picks the top-k sentences in document order and reports ROUGE against the
reference; `valid_rouge` (mean of ROUGE-1/2/L F1) drives model selection and early stopping."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.data_prep import DocumentDataset
from hibert.errors import UserError
from hibert.finetune.base.task import EncoderHead, encoder_and_head_groups
from hibert.finetune.evaluation.report import documents
from hibert.finetune.extractive.evaluate import rouge_of_selection, tune_selection
from hibert.finetune.extractive.export import score_documents, sentence_scores
from hibert.finetune.extractive.settings import (
    SELECTION_FILE,
    TUNING_FILE,
    selection_note,
    selection_provenance,
    stored_selection,
)
from hibert.modeling import HibertExtractive, flops_per_batch, pack_documents
from hibert.modeling.packing import PackedDocuments, TensorBundle
from hibert.runtime.task import EvalContext, LoaderItem, ParamGroup, Task


@dataclass
class ExtractiveBatch(TensorBundle):
    docs: PackedDocuments
    labels: torch.Tensor               # [S] 0/1 per packed sentence


class ExtractiveTask(EncoderHead, Task):
    name = "extractive"
    eval_metric = "valid_rouge"
    eval_mode = "max"
    stat_keys = ("loss_sum", "num_sentences", "correct")

    def __init__(self, cfg: Config, model_cfg: ModelConfig):
        self.cfg, self.model_cfg = cfg, model_cfg

    def build_model(self) -> torch.nn.Module:
        return HibertExtractive(self.model_cfg)

    def param_groups(self, model: torch.nn.Module, cfg: Config) -> list[ParamGroup]:
        # finetune.encoder_lr_scale / encoder_warmup_steps reach the encoder (0: a frozen encoder, a linear probe)
        return encoder_and_head_groups(model, cfg, "head.")

    def make_item(self, dataset, doc_indices: np.ndarray, epoch: int) -> LoaderItem:
        docs, labels = [], []
        for i in doc_indices.tolist():
            sents = dataset[i]
            lab = dataset.labels(i)
            if lab is None:
                raise ValueError(f"{dataset.split} document {dataset.doc_id(i)} has no oracle labels: "
                                 "extractive finetuning needs a corpus with summaries")
            docs.append(sents)
            labels.append(np.asarray(lab, dtype=np.int64))
        batch = ExtractiveBatch(pack_documents(docs), torch.from_numpy(np.concatenate(labels)))
        sent_lens = [len(s) + 1 for d in docs for s in d]
        flops = flops_per_batch(self.model_cfg, sent_lens, [len(d) for d in docs], None, backward=True)
        return LoaderItem(batch, real_tokens=sum(sent_lens), flops=flops, num_docs=len(docs),
                          extra={"doc_indices": doc_indices.tolist(), "doc_lens": [len(d) for d in docs]})

    def loss(self, engine, item: LoaderItem):
        b: ExtractiveBatch = item.batch
        logits = engine(b.docs)
        loss = engine.module.loss(logits, b.labels)
        n = b.labels.numel()
        scores = sentence_scores(logits).detach()
        pred = (scores > 0.5).long()
        item.extra["scores"] = scores
        return loss, {"loss_sum": loss.detach().double() * n,
                      "num_sentences": torch.tensor(float(n), dtype=torch.float64),
                      "correct": (pred == b.labels).sum().double()}

    def summarize(self, sums: dict[str, float], prefix: str) -> dict[str, float]:
        n = sums.get("num_sentences", 0.0)
        if n <= 0:
            return {}
        return {f"{prefix}loss": sums["loss_sum"] / n, f"{prefix}accuracy": sums["correct"] / n}

    def predict_chunks(self, ctx: EvalContext, data) -> dict[int, np.ndarray]:
        """Collective: sentence scores for every chunk of `data`, complete on rank 0."""
        mine: dict[int, np.ndarray] = {}
        for item, counted in ctx.items(data):
            self.loss(ctx.engine, item)
            if not counted:
                continue
            scores = item.extra["scores"].float().cpu().numpy()
            start = 0
            for i, n in zip(item.extra["doc_indices"], item.extra["doc_lens"]):
                mine[i] = scores[start:start + n]
                start += n
        if dist.is_initialized() and dist.get_world_size() > 1:
            parts: list = [None] * dist.get_world_size()
            dist.all_gather_object(parts, mine)
            mine = {k: v for p in parts for k, v in p.items()}
        return mine

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        metrics = super().evaluate(ctx)
        scores = self.predict_chunks(ctx, ctx.valid_data)
        box = [None]
        if ctx.is_main:
            r = rouge_of_selection(ctx.valid_data, scores, self.cfg.objective.top_k,
                                   self.cfg.objective.trigram_blocking)
            box = [{"valid_rouge1": r["rouge1_f"], "valid_rouge2": r["rouge2_f"], "valid_rougeL": r["rougeL_f"],
                    "valid_rouge": (r["rouge1_f"] + r["rouge2_f"] + r["rougeL_f"]) / 3}]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(box, src=0)  # every rank takes the same early-stopping decision
        return {**metrics, **box[0]}

    def write_export_extras(self, out_dir, full_state: dict[str, torch.Tensor]) -> None:
        head = {k[len("head."):]: v.contiguous() for k, v in full_state.items() if k.startswith("head.")}
        save_file(head, str(Path(out_dir) / "head.safetensors"))
        selection, tuning = self.tuned_selection(full_state)
        # the selection `hibert evaluate` scores, `hibert summarize` and the server use: one file, one system
        (Path(out_dir) / SELECTION_FILE).write_text(json.dumps(selection))
        (Path(out_dir) / TUNING_FILE).write_text(json.dumps(tuning, indent=1))

    def registry_notes(self, out_dir) -> tuple[list[str], dict[str, str]]:
        selection = stored_selection(Path(out_dir))
        return ([selection_note(selection, selection_provenance(Path(out_dir)), given=False)],
                {"top_k": str(selection.top_k), "trigram_blocking": str(selection.trigram_blocking).lower()})

    def tuned_selection(self, full_state: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(extractive.json, its provenance): k and trigram blocking tuned on the validation split with the
        exported weights themselves (not one evaluation's: the export may average several), or the
        configured ones when tuning is off or there is no validation split."""
        obj = self.cfg.objective
        configured = {"top_k": obj.top_k, "trigram_blocking": obj.trigram_blocking}
        positions = {"train_oracle_positions": oracle_positions(self.cfg.data.dataset_dir, obj.tune_documents * 10)}
        if not obj.tune_selection:
            return configured, {"tuned": False, "reason": "objective.tune_selection=false", **configured, **positions}
        valid = DocumentDataset(self.cfg.data.dataset_dir, "valid")
        n = min(len(valid), obj.tune_documents)
        if n == 0:
            return configured, {"tuned": False, "reason": "no validation documents", **configured, **positions}
        model = HibertExtractive(self.model_cfg)
        model.load_state_dict({k: v.float() for k, v in full_state.items()})
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model.to(device).eval()
        while n < len(valid) and valid.source_doc(n) == valid.source_doc(n - 1):
            n += 1   # a document's chunks are consecutive: never tune on half a document
        scores = score_documents(model, [valid[i] for i in range(n)], device)
        del model   # the engine's own copy stays where it is
        try:   # the documents of these n chunks only, made once: never the whole split ten times
            t = tune_selection(valid, dict(enumerate(scores)), docs=documents(LeadingChunks(valid, n)))
        except (UserError, KeyError) as e:   # no scored document has a summary: nothing to tune on
            return configured, {"tuned": False, "reason": f"no scored validation document with a summary ({e})",
                                **configured, **positions}
        return ({"top_k": t["k"], "trigram_blocking": t["trigram_blocking"]},
                {"tuned": True, "split": "valid", "documents": n, "metric": "mean of ROUGE-1/2/L F1",
                 "top_k": t["k"], "trigram_blocking": t["trigram_blocking"], "configured": configured,
                 "grid": t["grid"], **positions})


def oracle_positions(dataset_dir, limit: int) -> dict[str, Any] | None:
    """How often each sentence position of a document's first chunk is in the oracle summary, over the first
    `limit` training chunks: what a position-only extractor learns (the evaluation's `position` baseline picks
    the most frequent positions a document has). None without a training split with labels."""
    try:
        train = DocumentDataset(dataset_dir, "train")
    except (FileNotFoundError, UserError):
        return None
    counts: list[int] = []
    docs = 0
    for i in range(min(len(train), limit)):
        if train.chunk_index(i) != 0:
            continue
        labels = train.labels(i)
        if labels is None:
            continue
        docs += 1
        for j in np.flatnonzero(np.asarray(labels)).tolist():
            counts.extend([0] * (j + 1 - len(counts)))
            counts[j] += 1
    return {"documents": docs, "counts": counts} if docs else None


class LeadingChunks:
    """The first `n` chunks of a split, as `documents()` reads a dataset (everything else delegated)."""

    def __init__(self, dataset, n: int):
        self._dataset, self._n = dataset, n

    def __len__(self) -> int:
        return self._n

    def __getattr__(self, name: str):
        return getattr(self._dataset, name)
