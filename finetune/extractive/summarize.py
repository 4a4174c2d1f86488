"""Raw text -> extractive summary with a finetuned model: the top-k sentences in document order."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hibert.config import Config
from hibert.finetune.base.selection import select
from hibert.finetune.extractive.export import load_extractive, score_documents
from hibert.finetune.extractive.settings import ExtractiveSelection, stored_selection
from hibert.finetune.inference.text import Summary, TextEncoder
from hibert.finetune.settings import SummarizeSettings


class Summarizer:
    def __init__(self, export_dir: Path, device: str = "cpu", stanza_dir: str | None = None,
                 selection: ExtractiveSelection | None = None):
        self.model, meta = load_extractive(export_dir, device)
        self.device = device
        self.selection = selection or stored_selection(export_dir)
        self.encode = TextEncoder(export_dir, meta, stanza_dir)
        self.cfg = self.encode.cfg

    def summarize_all(self, docs: list[tuple[str, str]], settings: ExtractiveSelection | None = None) -> list[Summary]:
        """One summary per (id, text); `settings`: the selection of this call (default: the loaded one)."""
        return [self(doc_id, text, settings) for doc_id, text in docs]

    def __call__(self, doc_id: str, text: str, settings: ExtractiveSelection | None = None) -> Summary:
        selection = settings or self.selection
        k = selection.top_k
        texts, ids, ptb = self.encode(text, doc_id)
        if not texts:
            return Summary(doc_id, [], [], 0, "no sentences found")
        if len(texts) <= k:
            return Summary(doc_id, texts, list(range(len(texts))), len(texts),
                           f"document has {len(texts)} sentence(s), at most k={k}: returned whole")
        step = self.cfg.max_doc_sentences
        chunks = [ids[i:i + step] for i in range(0, len(ids), step)]
        scores = np.concatenate(score_documents(self.model, chunks, self.device))
        chosen = select(scores, texts, k, selection.trigram_blocking)
        return Summary(doc_id, [texts[i] for i in chosen], chosen, len(texts),
                       "input read as PTB-tokenized text" if ptb else "")


def summarizer(cfg: Config, local: Path, device: str, selection: ExtractiveSelection,
               settings: SummarizeSettings) -> Summarizer:
    return Summarizer(local, device, cfg.data.segmenter.stanza_dir, selection)
