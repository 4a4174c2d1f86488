"""A head defined outside the project, registered through the public registration point only
(`finetune.heads.register_head`): a 'lead-k' scorer — a linear layer on each document-level sentence vector,
trained to tell the first 3 sentences of a document from the rest. tests/test_head_registry.py names this
module in $HIBERT_HEADS and runs it through `hibert finetune`, `evaluate` and `summarize`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from hibert.data_prep import DocumentDataset
from hibert.finetune.base.report import baseline_systems, documents, score_lines, score_systems, write_report
from hibert.finetune.base.selection import select
from hibert.finetune.base.task import EncoderHead
from hibert.finetune.base.text import Summary, TextEncoder
from hibert.finetune.extractive.evaluate import chunk_to_doc_scores
from hibert.finetune.extractive.export import score_documents, score_split
from hibert.finetune.heads import EvalOutcome, HeadError, HeadSpec, register_head
from hibert.modeling import HibertExtractive, flops_per_batch, pack_documents
from hibert.modeling.packing import PackedDocuments, TensorBundle
from hibert.runtime.export import load_encoder, read_export
from hibert.runtime.task import LoaderItem, Task

LEAD = 3
WEIGHTS = "lead_head.safetensors"


@dataclass
class LeadBatch(TensorBundle):
    docs: PackedDocuments
    labels: torch.Tensor


class LeadTask(EncoderHead, Task):
    name = "lead-k"
    stat_keys = ("loss_sum", "sentences")

    def __init__(self, cfg, model_cfg, init_state):
        self.cfg, self.model_cfg, self.init_state = cfg, model_cfg, init_state

    def build_model(self) -> torch.nn.Module:
        return self.load_init_encoder(HibertExtractive(self.model_cfg))

    def make_item(self, dataset, doc_indices: np.ndarray, epoch: int) -> LoaderItem:
        docs = [dataset[i] for i in doc_indices.tolist()]
        labels = np.concatenate([(np.arange(len(d)) < LEAD).astype(np.int64) for d in docs])
        sent_lens = [len(s) + 1 for d in docs for s in d]
        flops = flops_per_batch(self.model_cfg, sent_lens, [len(d) for d in docs], None, backward=True)
        return LoaderItem(LeadBatch(pack_documents(docs), torch.from_numpy(labels)), real_tokens=sum(sent_lens),
                          flops=flops, num_docs=len(docs))

    def loss(self, engine, item: LoaderItem):
        loss = engine.module.loss(engine(item.batch.docs), item.batch.labels)
        n = torch.tensor(float(item.batch.labels.numel()), dtype=torch.float64)
        return loss, {"loss_sum": loss.detach().double() * n, "sentences": n}

    def summarize(self, sums: dict[str, float], prefix: str) -> dict[str, float]:
        return {f"{prefix}loss": sums["loss_sum"] / sums["sentences"]} if sums.get("sentences") else {}

    def write_export_extras(self, out_dir, full_state: dict[str, torch.Tensor]) -> None:
        save_file({k[len("head."):]: v.contiguous() for k, v in full_state.items() if k.startswith("head.")},
                  str(Path(out_dir) / WEIGHTS))


def load(export_dir: Path) -> tuple[torch.nn.Module, dict]:
    enc, model_cfg, meta = read_export(export_dir)
    model = HibertExtractive(model_cfg)
    load_encoder(model.encoder, enc)
    model.head.load_state_dict(load_file(str(Path(export_dir) / WEIGHTS)))
    return model.eval(), meta


def build_task(cfg, inputs, model_cfg) -> LeadTask:
    if inputs.train.is_clusters:
        raise HeadError("lead-k reads documents")
    return LeadTask(cfg, model_cfg, inputs.init.state if inputs.init else None)


def evaluate(cfg, settings, local: Path, ref: str, clusters: bool) -> EvalOutcome:
    model, meta = load(local)
    test = DocumentDataset(cfg.data.dataset_dir, settings.split)
    docs = documents(test)
    scores = chunk_to_doc_scores(test, score_split(model, test))
    systems = {"model": [[d.sentences[i] for i in select(scores[d.doc_id], d.sentences, LEAD)] for d in docs],
               **baseline_systems(docs)}
    result = score_systems(docs, systems, n_resamples=settings.bootstrap)
    report_meta = {"task": "lead-k", "model": ref, "encoder_init": meta.get("init"), "split": settings.split,
                   "dataset_manifest": "none"}
    out = settings.report_dir(cfg.run_dir)
    paths = write_report(out, result, docs, report_meta)
    return EvalOutcome(out, score_lines(result, paths), result, report_meta)


class LeadSummarizer:
    def __init__(self, cfg, local: Path, device: str, generation, settings):
        self.model, meta = load(local)
        self.encode = TextEncoder(local, meta, cfg.data.segmenter.stanza_dir)

    def summarize_all(self, docs: list[tuple[str, str]]) -> list[Summary]:
        out = []
        for doc_id, text in docs:
            texts, ids, _ = self.encode(text)
            scores = score_documents(self.model, [ids])[0]
            chosen = select(scores, texts, LEAD)
            out.append(Summary(doc_id, [texts[i] for i in chosen], chosen, len(texts), "lead-k head"))
        return out


register_head(HeadSpec(name="lead-k", title="lead-k scorer", registered_model="hibert-lead-k",
                       build_task=build_task, evaluate=evaluate, summarizer=LeadSummarizer,
                       load=lambda export_dir, device: load(export_dir), export_files=(WEIGHTS,)))
