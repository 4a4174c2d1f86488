"""Raw text -> extractive summary with a finetuned model: the top-k sentences in document order."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hibert.finetune.base.selection import select
from hibert.finetune.base.text import Summary, TextEncoder
from hibert.finetune.extractive.export import load_extractive, score_documents


class Summarizer:
    def __init__(self, export_dir: Path, device: str = "cpu", stanza_dir: str | None = None, k: int | None = None):
        self.model, meta = load_extractive(export_dir, device)
        self.device = device
        self.k = k or meta["selection"].get("top_k", 3)
        self.trigram_blocking = meta["selection"].get("trigram_blocking", False)
        self.encode = TextEncoder(export_dir, meta, stanza_dir)
        self.cfg = self.encode.cfg

    def summarize_all(self, docs: list[tuple[str, str]], k: int | None = None) -> list[Summary]:
        """One summary per (id, text); `k`: sentences to extract in this call (default: the loaded k)."""
        return [self(doc_id, text, k) for doc_id, text in docs]

    def __call__(self, doc_id: str, text: str, k: int | None = None) -> Summary:
        k = k or self.k
        texts, ids, ptb = self.encode(text, doc_id)
        if not texts:
            return Summary(doc_id, [], [], 0, "no sentences found")
        if len(texts) <= k:
            return Summary(doc_id, texts, list(range(len(texts))), len(texts),
                           f"document has {len(texts)} sentence(s), at most k={k}: returned whole")
        step = self.cfg.max_doc_sentences
        chunks = [ids[i:i + step] for i in range(0, len(ids), step)]
        scores = np.concatenate(score_documents(self.model, chunks, self.device))
        chosen = select(scores, texts, k, self.trigram_blocking)
        return Summary(doc_id, [texts[i] for i in chosen], chosen, len(texts),
                       "input read as PTB-tokenized text" if ptb else "")
