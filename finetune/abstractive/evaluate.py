"""`hibert evaluate` for decoders: an abstractive export on documents (the first chunk of each; ROUGE with
CIs next to Lead-3 and the oracle, paired bootstrap against any other run's report, novel n-gram rates,
length and repetition), and a decoder on a cluster dataset — the multi-document summarizer, or a flat
abstractive model reading the ranked units back to back — next to Lead (first sentences of the first
document; first words to the gold length, in document order and — Liu & Lapata's definition — of the title
and the ranked units) and a tf-idf centroid extract. Reports on synthetic clusters say so in their title
and meta."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hibert.config import Config
from hibert.config.abstractive import GenerationConfig
from hibert.config.mds import MDSConfig
from hibert.data_prep import DocumentDataset
from hibert.errors import UserError
from hibert.finetune.abstractive.data import FirstChunks
from hibert.finetune.abstractive.metrics import abstractiveness
from hibert.finetune.base.clusters import (
    ORACLE_NOTE,
    cluster_document,
    cluster_graphs,
    data_note,
    graph_note,
    lead_first_document,
    lead_tokens,
    ranked_sentences,
    tfidf_extract,
)
from hibert.finetune.evaluation.report import (
    Document,
    documents,
)
from hibert.finetune.evaluation.skeleton import SummaryEvaluation
from hibert.finetune.inference.decoding import Decoder
from hibert.finetune.ranker.ranking import ranked_view
from hibert.finetune.settings import EvalSettings
from hibert.heads import EvalOutcome
from hibert.redact import redact_uri

log = logging.getLogger("hibert.evaluate")


class AbstractiveEvaluation(SummaryEvaluation):
    """An abstractive export on a split of documents: beam-search summaries of each document's first chunk
    next to Lead-3 and the oracle (which see the whole document), with novelty and repetition."""

    @property
    def generation(self):
        return self.resolved

    def view(self) -> list[Document]:
        cfg, settings = self.cfg, self.settings
        self.test = DocumentDataset(cfg.data.dataset_dir, settings.split)
        self.chunks = FirstChunks(self.test)
        if len(self.chunks) == 0:
            raise UserError(f"hibert evaluate: split {settings.split!r} of {cfg.data.dataset_dir} has no documents "
                            "with summaries")
        docs = documents(self.test)         # whole documents: Lead-3, the oracle and novelty see all of them
        self.first = {self.chunks.source_doc(i): i for i in range(len(self.chunks))}
        docs = [d for d in docs if d.doc_id in self.first]
        return docs[: settings.limit] if settings.limit else docs

    def predict(self, docs: list[Document]) -> list[list[str]]:
        decoder = Decoder(self.model, self.test.tokenizer_path, self.generation, self.device)
        return [x.sentences for x in decoder.summarize_ids([self.chunks[self.first[d.doc_id]] for d in docs])]

    def add_metrics(self, result, docs, systems) -> None:
        sources = [d.sentences for d in docs]
        result["abstractiveness"] = {name: abstractiveness(s, sources) for name, s in systems.items()}

    def report_meta(self, compared_with: list[str]) -> dict[str, Any]:
        # the first chunk: at most the dataset's max_doc_sentences sentences (its chunk size)
        first = self.test.manifest.get("limits", {}).get("max_doc_sentences", self.cfg.data.max_doc_sentences)
        return {"task": "abstractive", "model": redact_uri(self.ref), "encoder_init": self.meta.get("init"),
                "dataset": str(self.cfg.data.dataset_dir), "split": self.settings.split,
                "generation": self.generation.model_dump(), "reads": "the first chunk of each document "
                f"(<= {self.model.encoder.cfg.max_positions} positions; its first {first} sentences)",
                "reads_sentences": first,
                "lead3": "the first 3 sentences", "compared_with": compared_with,
                "dataset_manifest": self.dataset_manifest(), "finetune_run": self.meta.get("mlflow_run_id")}


class ClusterEvaluation(AbstractiveEvaluation):
    """A decoder on a split of clusters: the multi-document summarizer (`mds`) or a flat
    abstractive model reading the ranked units back to back, next to Lead (first sentences of the first
    document; first words to the gold length, in document order and — Liu & Lapata's definition — of the
    title and the ranked units) and a tf-idf centroid extract. `cfg` is not changed: the units are read with
    a copy holding the model's own `mds:` settings (ranking, budget, unit cap) and the command line's
    --ranking / --budget-tokens."""

    def __init__(self, cfg: Config, settings: EvalSettings, export_dir: Path, ref: str, generation, mds: bool):
        super().__init__(cfg, settings, export_dir, ref, generation)
        self.mds = mds

    def load(self):
        model, meta = super().load()
        mds_cfg = self.cfg.mds
        if self.mds:  # the model reads units as it was trained to: its ranking, budget and unit cap
            mds_cfg = meta["mds"]
        elif meta["decoder"].get("mds"):  # a flat baseline trained on clusters records the same settings
            mds_cfg = MDSConfig.from_export(meta["decoder"]["mds"])
        self.trained_budget = mds_cfg.budget_tokens
        if self.settings.ranking:  # e.g. the learned ranker at test time, or tfidf for an ablation
            mds_cfg = mds_cfg.model_copy(update={"ranking": self.settings.ranking})
        if self.settings.budget_tokens:  # Liu & Lapata's test: trained on 800 tokens, read 1,600
            mds_cfg = mds_cfg.model_copy(update={"budget_tokens": self.settings.budget_tokens})
        self.run_cfg = self.cfg.model_copy(update={"mds": mds_cfg})
        return model, meta

    def view(self) -> list[Document]:
        cfg, settings = self.run_cfg, self.settings
        if cfg.mds.ranking == "oracle" and settings.ranking != "oracle":
            # the oracle ranks units by ROUGE against the very summaries being scored
            raise UserError("hibert evaluate: this model ranks units with the oracle, which reads the reference "
                            "summaries of the split it scores; pass --ranking tfidf|lead|models:/hibert-ranker@..., "
                            "or --ranking oracle for an upper bound (labelled so in the report)")
        self.test = DocumentDataset(cfg.data.dataset_dir, settings.split)
        self.ranked = ranked_view(cfg, self.test, None, settings.report_dir(cfg.run_dir))
        n = len(self.ranked) if not settings.limit else min(settings.limit, len(self.ranked))
        if n == 0:
            raise UserError(f"hibert evaluate: split {settings.split!r} of {cfg.data.dataset_dir} has no clusters "
                            "with summaries")
        self.idx = list(range(n))
        docs, self.sent_docs = zip(*(cluster_document(self.ranked, k) for k in self.idx))
        return list(docs)

    def predict(self, docs: list[Document]) -> list[list[str]]:
        cfg, view, idx = self.run_cfg, self.ranked, self.idx
        decoder = Decoder(self.model, self.test.tokenizer_path, self.generation, self.device, clusters=self.mds)
        if self.mds:
            graphs = cluster_graphs(view, idx, cfg.mds) if cfg.mds.graph_attention else None
            decoded = decoder.summarize_ids([view.units(k) for k in idx], graphs=graphs)
        else:
            decoded = decoder.summarize_ids([view[k] for k in idx])
        return [x.sentences for x in decoded]

    def baselines(self, docs: list[Document]) -> dict[str, list[list[str]]]:
        gold_words = [len(" ".join(d.references[0]).split()) for d in docs]
        return {"lead3_first_doc": [lead_first_document(d.sentences, sd, 3) for d, sd in zip(docs, self.sent_docs)],
                "lead_gold_length": [lead_tokens(d.sentences, g) for d, g in zip(docs, gold_words)],
                "lead_ranked": [lead_tokens(ranked_sentences(self.ranked, k), g) for k, g in zip(self.idx, gold_words)],
                "tfidf_extract": [tfidf_extract(d.sentences, 3) for d in docs]}

    def report_meta(self, compared_with: list[str]) -> dict[str, Any]:
        cfg, mds = self.run_cfg, self.mds
        task = "multi-document (mds)" if mds else "multi-document (flat abstractive baseline)"
        if self.test.manifest.get("synthetic"):
            task += ", SYNTHETIC clusters"
        return {"task": task,
                **data_note(self.test), "model": redact_uri(self.ref), "encoder_init": self.meta.get("init"),
                "dataset": str(cfg.data.dataset_dir), "split": self.settings.split,
                "generation": self.generation.model_dump(),
                "reads": f"units ranked by {cfg.mds.ranking}, <= {cfg.mds.budget_tokens} tokens (trained on "
                         f"{self.trained_budget})"
                         f"{'' if mds else ', back to back as one document'}"
                         f"{ORACLE_NOTE if cfg.mds.ranking == 'oracle' else ''}",
                **({"unit_graph": graph_note(cfg.mds)} if mds else {}),
                "lead3_first_doc": "the first 3 sentences of the first document",
                "lead_gold_length": "the first words of the documents back to back (document order), as many as "
                                    "the reference has",
                "lead_ranked": f"Liu & Lapata's Lead: the title and the units ranked by {cfg.mds.ranking} back "
                               "to back, cut at the reference's length in words",
                "tfidf_extract": "3 sentences by tf-idf cosine to the cluster centroid, redundancy-filtered",
                "compared_with": compared_with,
                "dataset_manifest": self.dataset_manifest(), "finetune_run": self.meta.get("mlflow_run_id")}


def evaluate(cfg: Config, settings: EvalSettings, local: Path, ref: str, clusters: bool,
             generation: GenerationConfig) -> EvalOutcome:
    if clusters:
        return ClusterEvaluation(cfg, settings, local, ref, generation, mds=False).run()
    return AbstractiveEvaluation(cfg, settings, local, ref, generation).run()
