"""A head defined outside the project, registered through the public registration point only
(`hibert.heads.register_head`): a 'lead-k' scorer — a linear layer on each document-level sentence vector,
trained to tell the first `lead.sentences` sentences of a document from the rest. It brings everything of its
own: a config section (`lead:`, with a bound), its inference settings (a `--lead-sentences` flag of
`hibert summarize`, the served param `lead_sentences`), its export file and its report — touching no project
file. tests/test_head_registry.py names this module in $HIBERT_HEADS and runs it through `hibert finetune`,
`evaluate`, `summarize` and `mlflow models serve`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import Field
from safetensors.torch import load_file, save_file

from hibert.config.base import Section, flag
from hibert.data_prep import DocumentDataset
from hibert.finetune.evaluation.report import baseline_systems, documents, score_lines, score_systems, write_report
from hibert.finetune.base.selection import select
from hibert.finetune.base.task import EncoderHead
from hibert.finetune.inference.text import Summary, TextEncoder
from hibert.finetune.extractive.evaluate import chunk_to_doc_scores
from hibert.finetune.extractive.export import score_documents, score_split
from hibert.heads import EvalOutcome, HeadError, HeadSpec, Inference, register_head
from hibert.modeling import HibertExtractive, flops_per_batch, pack_documents
from hibert.modeling.packing import PackedDocuments, TensorBundle
from hibert.runtime.export import load_encoder, read_export
from hibert.runtime.task import LoaderItem, Task

WEIGHTS = "lead_head.safetensors"
SETTINGS = "lead.json"


class LeadConfig(Section):
    """The `lead:` config section: the head's own, merged into the schema when the registry loads."""
    sentences: int = Field(3, ge=1, le=10)   # the first N sentences are the positives


class LeadSelection(Section):
    """What an export picks at inference (lead.json): the flag --lead-sentences, served as `lead_sentences`."""
    sentences: int = Field(3, ge=1, le=10, json_schema_extra=flag("--lead-sentences", "sentences to pick",
                                                                  commands=("summarize",)))


def stored_selection(export_dir: Path) -> LeadSelection:
    path = Path(export_dir) / SETTINGS
    return LeadSelection.model_validate_json(path.read_text()) if path.is_file() else LeadSelection()


@dataclass
class LeadBatch(TensorBundle):
    docs: PackedDocuments
    labels: torch.Tensor


class LeadTask(EncoderHead, Task):
    name = "lead-k"
    stat_keys = ("loss_sum", "sentences")

    def __init__(self, cfg, model_cfg):
        self.cfg, self.model_cfg = cfg, model_cfg

    def build_model(self) -> torch.nn.Module:
        return HibertExtractive(self.model_cfg)   # the runtime loads run.init's encoder into it

    def make_item(self, dataset, doc_indices: np.ndarray, epoch: int) -> LoaderItem:
        docs = [dataset[i] for i in doc_indices.tolist()]
        labels = np.concatenate([(np.arange(len(d)) < self.cfg.lead.sentences).astype(np.int64) for d in docs])
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
        (Path(out_dir) / SETTINGS).write_text(json.dumps({"sentences": self.cfg.lead.sentences}))


def load(export_dir: Path) -> tuple[torch.nn.Module, dict]:
    enc, model_cfg, meta = read_export(export_dir)
    model = HibertExtractive(model_cfg)
    load_encoder(model.encoder, enc)
    model.head.load_state_dict(load_file(str(Path(export_dir) / WEIGHTS)))
    return model.eval(), meta


def build_task(cfg, inputs, model_cfg) -> LeadTask:
    if inputs.train.is_clusters:
        raise HeadError("lead-k reads documents")
    return LeadTask(cfg, model_cfg)


def evaluate(cfg, settings, local: Path, ref: str, clusters: bool, selection: LeadSelection) -> EvalOutcome:
    model, meta = load(local)
    test = DocumentDataset(cfg.data.dataset_dir, settings.split)
    docs = documents(test)
    scores = chunk_to_doc_scores(test, score_split(model, test))
    systems = {"model": [[d.sentences[i] for i in select(scores[d.doc_id], d.sentences, selection.sentences)]
                         for d in docs],
               **baseline_systems(docs)}
    result = score_systems(docs, systems, n_resamples=settings.bootstrap)
    report_meta = {"task": "lead-k", "model": ref, "encoder_init": meta.get("init"), "split": settings.split,
                   "dataset_manifest": "none"}
    out = settings.report_dir(cfg.run_dir)
    paths = write_report(out, result, docs, report_meta)
    return EvalOutcome(out, score_lines(result, paths), result, report_meta)


class LeadSummarizer:
    def __init__(self, cfg, local: Path, device: str, selection: LeadSelection, settings):
        self.model, meta = load(local)
        self.encode = TextEncoder(local, meta, cfg.data.segmenter.stanza_dir)
        self.selection = selection

    def summarize_all(self, docs: list[tuple[str, str]], settings: LeadSelection | None = None) -> list[Summary]:
        n = (settings or self.selection).sentences
        out = []
        for doc_id, text in docs:
            texts, ids, _ = self.encode(text)
            scores = score_documents(self.model, [ids])[0]
            chosen = select(scores, texts, n)
            out.append(Summary(doc_id, [texts[i] for i in chosen], chosen, len(texts), "lead-k head"))
        return out


register_head(HeadSpec(name="lead-k", title="lead-k scorer", registered_model="hibert-lead-k",
                       build_task=build_task, evaluate=evaluate, summarizer=LeadSummarizer,
                       load=lambda export_dir, device: load(export_dir), export_files=(WEIGHTS, SETTINGS),
                       config={"lead": LeadConfig},
                       inference=Inference(LeadSelection, stored_selection, title="lead-k selection")))
