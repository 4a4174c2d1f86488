"""Decoding with an abstractive model outside the training loop (single process, no DeepSpeed): load an
export, batch documents by token budget, run the batched beam search, turn subwords back into sentences."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from finetune.abstractive_data import split_sentences
from hibert.runtime.batching import doc_costs, plan_epoch


@dataclass
class Decoded:
    sentences: list[str]      # summary sentences ([SEP]-separated in the model's output)
    ids: list[int]            # the decoded subwords (no BOS/EOS)
    score: float              # length-penalised log-probability of the chosen hypothesis


def word_start_mask(sp) -> np.ndarray:
    """True for pieces that begin a word (SentencePiece marks them with '▁') and for control/special
    pieces, which stand alone; word-level n-gram blocking groups the rest with the piece before them."""
    n = sp.get_piece_size()
    return np.array([sp.id_to_piece(i).startswith("\u2581") or sp.is_control(i) or sp.is_unknown(i)
                     or sp.id_to_piece(i).startswith("[") and sp.id_to_piece(i).endswith("]")
                     for i in range(n)], dtype=bool)


class Decoder:
    """Summaries of encoded documents with a (plain, single-process) `HibertAbstractive`, or of clusters
    (lists of unit documents, in rank order) with a `HibertMDS` (`clusters=True`)."""

    def __init__(self, model: torch.nn.Module, tokenizer_path: Path, generation, device: torch.device | str,
                 batch_tokens: int = 32768, max_docs: int = 16, clusters: bool = False):
        from data_prep import tokenizer as tok

        self.model, self.generation, self.device = model, generation, torch.device(device)
        self.clusters = clusters
        self.sp = tok.load(tokenizer_path)
        self.word_start = torch.from_numpy(word_start_mask(self.sp)).to(self.device)
        self.batch_tokens, self.max_docs = batch_tokens, max_docs

    def _autocast(self):
        if self.device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    @torch.no_grad()
    def summarize_ids(self, docs: list, generation=None, graphs: list[np.ndarray] | None = None) -> list[Decoded]:
        """One summary per document (lists of encoded sentences) or cluster (lists of units), in input order;
        `graphs`: each cluster's unit graph (graph-informed attention)."""
        from modeling import pack_documents
        from modeling.clusters import pack_clusters
        from modeling.generate import generate

        gen = generation or self.generation
        if not docs:
            return []
        sents = [[s for u in d for s in u] for d in docs] if self.clusters else docs
        costs = doc_costs(np.array([sum(len(s) for s in d) for d in sents]), np.array([len(d) for d in sents]))
        plan = plan_epoch(costs, seed=0, epoch=0, batch_tokens=self.batch_tokens, max_docs=min(self.max_docs,
                          gen.batch_size), world=1, accum=1)
        out: list[Decoded | None] = [None] * len(docs)
        for idx in sorted(plan.batches, key=lambda b: int(b[0])):
            rows = idx.tolist()
            if self.clusters:
                batch = pack_clusters([docs[i] for i in rows],
                                      None if graphs is None else [graphs[i] for i in rows]).to(self.device)
            else:
                batch = pack_documents([docs[i] for i in rows]).to(self.device)
            with self._autocast():
                hyps = generate(self.model, batch, gen, word_start=self.word_start)
            for i, h in zip(idx.tolist(), hyps):
                ids = [int(t) for t in h.tokens]
                out[i] = Decoded([self.sp.decode(s) for s in split_sentences(ids)], ids, float(h.score))
        return out  # type: ignore[return-value]


def load_abstractive(export_dir: Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model in eval mode on `device`, settings) from an export written by the abstractive task."""
    from safetensors.torch import load_file

    from finetune.abstractive_task import DECODER_CONFIG, DECODER_WEIGHTS
    from hibert.config.abstractive import DecoderConfig
    from modeling.abstractive import HibertAbstractive
    from hibert.runtime.export import load_encoder, read_export

    export_dir = Path(export_dir)
    enc, model_cfg, meta = read_export(export_dir)
    if not (export_dir / DECODER_WEIGHTS).is_file() or not (export_dir / DECODER_CONFIG).is_file():
        raise FileNotFoundError(f"{export_dir} holds no abstractive decoder ({DECODER_WEIGHTS}, {DECODER_CONFIG}): "
                                "pass a model produced by `hibert finetune finetune.task=abstractive`")
    settings = json.loads((export_dir / DECODER_CONFIG).read_text())
    model = HibertAbstractive(model_cfg, DecoderConfig.model_validate(settings["decoder"]))
    load_encoder(model.encoder, enc)
    missing, unexpected = model.load_state_dict(load_file(str(export_dir / DECODER_WEIGHTS)), strict=False)
    missing = [k for k in missing if not k.startswith("encoder.")]
    if missing or unexpected:
        raise ValueError(f"{export_dir}/{DECODER_WEIGHTS} does not fit the decoder of {DECODER_CONFIG}: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(device).eval(), {**meta, "generation": stored_generation(export_dir), "decoder": settings,
                                     "model": model_cfg.model_dump()}


def stored_generation(export_dir: Path):
    """The decoding settings an abstractive (or mds) export was written with (generation.json; the defaults
    when it has none) — read without loading any weights."""
    from finetune.abstractive_task import GENERATION_CONFIG
    from hibert.config.abstractive import GenerationConfig

    path = Path(export_dir) / GENERATION_CONFIG
    return _validated(GenerationConfig, _read_json(path), path) if path.is_file() else GenerationConfig()


def decoder_max_positions(export_dir: Path) -> int:
    """The decoder's target positions (decoder.max_positions of abstractive.json), without loading weights."""
    from finetune.abstractive_task import DECODER_CONFIG
    from hibert.config.abstractive import DecoderConfig

    path = Path(export_dir) / DECODER_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{export_dir} holds no abstractive decoder ({DECODER_CONFIG})")
    settings = _read_json(path)
    if not isinstance(settings, dict) or "decoder" not in settings:
        raise ValueError(f"{path} has no 'decoder' section (a damaged export)")
    return _validated(DecoderConfig, settings["decoder"], path).max_positions


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None


def _validated(schema, data, path: Path):
    """`schema.model_validate(data)`, its errors as the config loader words them (one line for one problem)."""
    from pydantic import ValidationError

    from hibert.config.load import format_validation_error

    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise ValueError(format_validation_error(e, str(path))) from None
