"""Raw text -> abstract with an abstractive export; documents are segmented and encoded as the model's
training data was, and decoded in batches."""
from __future__ import annotations

from pathlib import Path

from hibert.config import Config
from hibert.config.abstractive import GenerationConfig
from hibert.finetune.abstractive.export import load_abstractive
from hibert.finetune.abstractive.settings import stored_generation
from hibert.finetune.inference.decoding import Decoder
from hibert.finetune.inference.text import Summary, TextEncoder
from hibert.finetune.settings import SummarizeSettings


class AbstractiveSummarizer:
    """Raw text -> abstract with an abstractive export; documents are decoded in batches."""
    def __init__(self, export_dir: Path, device: str = "cpu", stanza_dir: str | None = None, generation=None):
        model, meta = load_abstractive(export_dir, device)
        self.generation = generation or stored_generation(export_dir)
        self.encode = TextEncoder(export_dir, meta, stanza_dir)
        self.decoder = Decoder(model, Path(export_dir) / "tokenizer.model", self.generation, device)

    def summarize_all(self, docs: list[tuple[str, str]], settings=None) -> list[Summary]:
        """One summary per (id, text); `settings`: the decoding of this call (default: the loaded one)."""
        encoded = [self.encode(text, doc_id) for doc_id, text in docs]
        step = self.encode.cfg.max_doc_sentences
        todo = [i for i, (texts, _, _) in enumerate(encoded) if texts]
        # the encoder reads the first max_doc_sentences sentences, as in training
        decoded = self.decoder.summarize_ids([encoded[i][1][:step] for i in todo], settings)
        out = [Summary(doc_id, [], [], 0, "no sentences found", 0) for doc_id, _ in docs]  # 0: every row has the key
        for i, d in zip(todo, decoded):
            texts, _, ptb = encoded[i]
            notes = (["input read as PTB-tokenized text"] if ptb else []) + \
                    ([f"read the first {step} of {len(texts)} sentences"] if len(texts) > step else [])
            out[i] = Summary(docs[i][0], d.sentences, [], len(texts), "; ".join(notes), len(d.ids))
        return out


def summarizer(cfg: Config, local: Path, device: str, generation: GenerationConfig,
               settings: SummarizeSettings) -> AbstractiveSummarizer:
    return AbstractiveSummarizer(local, device, cfg.data.segmenter.stanza_dir, generation)
