"""Several documents -> one abstract with a multi-document (mds) export: units cut, ranked and decoded as in
its training."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hibert.config import Config
from hibert.config.abstractive import GenerationConfig
from hibert.config.mds import ranking_kind
from hibert.data_prep.units import windows
from hibert.finetune.abstractive.settings import stored_generation
from hibert.finetune.base.clusters import budget_cut, rank_order, tfidf_scores, units_graph
from hibert.finetune.inference.decoding import Decoder
from hibert.finetune.inference.text import Summary, TextEncoder
from hibert.finetune.mds.export import load_mds, stored_mds_settings
from hibert.finetune.ranker.export import load_ranker, score_clusters
from hibert.finetune.settings import SummarizeSettings
from hibert.registry import resolve_model, tracking_uri


class ClusterSummarizer:
    """Several documents -> one abstract with a multi-document (mds) export: units as in its training data
    (paragraphs, windows of <= max_unit_sentences), ranked as the model was trained (tf-idf, document order,
    or its learned ranker; the label oracle needs a reference, so tf-idf stands in for it), cut to its token
    budget, decoded in batches."""
    def __init__(self, export_dir: Path, device: str = "cpu", stanza_dir: str | None = None, generation=None,
                 ranking: str | None = None, ranker_dir: Path | None = None):

        model, meta = load_mds(export_dir, device)
        self.generation = generation or stored_generation(export_dir)
        self.mds = meta["mds"]
        self.ranking = ranking or self.mds.ranking
        self.max_unit_sentences = int(meta.get("data", {}).get("clusters", {}).get("max_unit_sentences", 5))
        self.encode = TextEncoder(export_dir, meta, stanza_dir)
        self.decoder = Decoder(model, Path(export_dir) / "tokenizer.model", self.generation, device, clusters=True)
        self.ranker = None
        if ranker_dir is not None:
            self.ranker, _ = load_ranker(ranker_dir, device)
        self.device = device

    def units(self, documents: list[str], name: str = "input") -> tuple[list[list[str]], list[list[np.ndarray]], bool]:
        texts, ids, any_ptb = [], [], False
        for k, doc in enumerate(documents):
            paragraphs, ptb = self.encode.paragraphs(doc, f"{name} (document {k + 1})")
            any_ptb |= ptb
            for t, x in paragraphs:
                for a, b in windows(len(t), self.max_unit_sentences):
                    texts.append(t[a:b])
                    ids.append(x[a:b])
        return texts, ids, any_ptb

    def summarize_all(self, clusters: list[tuple[str, list[str]]], settings=None) -> list[Summary]:
        """One abstract per (id, documents); `settings`: the decoding of this call (default: the loaded one)."""
        prepared = [self.units(docs, cid) for cid, docs in clusters]
        todo = [i for i, (t, _, _) in enumerate(prepared) if t]
        chosen = {}
        scores = score_clusters(self.ranker, [prepared[i][1] for i in todo], self.device) if self.ranker else None
        for k, i in enumerate(todo):
            texts, ids, _ = prepared[i]
            if scores is not None:
                s = scores[k]
            elif self.ranking == "lead":
                s = -np.arange(len(texts), dtype=np.float64)
            else:
                s = tfidf_scores([" ".join(t) for t in texts])
            tokens = np.array([sum(len(x) + 1 for x in u) for u in ids])
            top = self.mds.top_units if self.mds.top_units else self.mds.max_units
            chosen[i] = budget_cut(rank_order(s), tokens, self.mds.budget_tokens, min(top, self.mds.max_units))
        batch = [[prepared[i][1][j] for j in chosen[i].tolist()] for i in todo]
        batch_texts = [[prepared[i][0][j] for j in chosen[i].tolist()] for i in todo]
        graphs = None
        if self.mds.graph_attention:
            graphs = [units_graph(t, c, self.mds) for t, c in zip(batch_texts, batch)]
        decoded = self.decoder.summarize_ids(batch, settings, graphs=graphs)
        out = [Summary(cid, [], [], 0, "no sentences found", 0) for cid, _ in clusters]  # 0: every row has the key
        for i, d in zip(todo, decoded):
            texts, _, ptb = prepared[i]
            n_units, n_sents = len(texts), sum(len(t) for t in texts)
            notes = (["input read as PTB-tokenized text"] if ptb else []) + \
                    [f"read {len(chosen[i])} of {n_units} units ({len(clusters[i][1])} documents)"]
            out[i] = Summary(clusters[i][0], d.sentences, [], n_sents, "; ".join(notes), len(d.ids))
        return out


def summarizer(cfg: Config, local: Path, device: str, generation: GenerationConfig,
               settings: SummarizeSettings) -> ClusterSummarizer:
    """Units ranked as `--ranking` says, else as the model was trained (a learned ranker is resolved here)."""
    ranking = settings.ranking or stored_mds_settings(local).ranking
    ranker_dir = None
    if ranking_kind(ranking) == "learned":
        # the user's model cache, as for the summarizer itself (never the working directory)
        ranker_dir = resolve_model(ranking, tracking_uri(cfg.tracking.uri, cfg.run.output_dir, create=False))
    return ClusterSummarizer(local, device, cfg.data.segmenter.stanza_dir, generation, ranking,
                             ranker_dir)
