"""Loading a multi-document summarizer export (single process, no DeepSpeed) and the cluster baselines
every report puts next to it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from finetune.mds_data import tfidf_scores

if TYPE_CHECKING:
    from hibert.config.mds import MDSConfig


def is_mds_export(local: Path) -> bool:
    from finetune.mds_task import MDS_CONFIG

    return (Path(local) / MDS_CONFIG).is_file()


def stored_mds_config(stored: dict[str, Any]) -> MDSConfig:
    """The `mds:` settings an export was trained with; one without `global_layer` predates the paper's
    per-head projections (eq. 16-19) and loads as the `v0` form it was trained with."""
    from hibert.config.mds import MDSConfig

    return MDSConfig.model_validate({"global_layer": "v0", **stored})


def load_mds(export_dir: Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """(HibertMDS in eval mode on `device`, settings) from an export written by the mds task."""
    from safetensors.torch import load_file

    from finetune.abstractive_inference import stored_generation
    from finetune.abstractive_task import DECODER_CONFIG, DECODER_WEIGHTS
    from finetune.mds_task import MDS_CONFIG
    from hibert.config.abstractive import DecoderConfig
    from modeling.mds import HibertMDS
    from hibert.runtime.export import load_encoder, read_export

    export_dir = Path(export_dir)
    enc, model_cfg, meta = read_export(export_dir)
    for name in (DECODER_WEIGHTS, DECODER_CONFIG, MDS_CONFIG):
        if not (export_dir / name).is_file():
            raise FileNotFoundError(f"{export_dir} has no {name}: pass a model produced by "
                                    "`hibert finetune finetune.task=mds`")
    settings = json.loads((export_dir / DECODER_CONFIG).read_text())
    mds = stored_mds_config(json.loads((export_dir / MDS_CONFIG).read_text())["mds"])
    model = HibertMDS(model_cfg, DecoderConfig.model_validate(settings["decoder"]), mds)
    load_encoder(model.encoder, enc)
    missing, unexpected = model.load_state_dict(load_file(str(export_dir / DECODER_WEIGHTS)), strict=False)
    missing = [k for k in missing if not k.startswith("encoder.")]
    if missing or unexpected:
        raise ValueError(f"{export_dir}/{DECODER_WEIGHTS} does not fit the model of {MDS_CONFIG}: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(device).eval(), {**meta, "generation": stored_generation(export_dir), "decoder": settings,
                                     "mds": mds, "model": model_cfg.model_dump()}


# -------------------------------------------------------------------------------------------- baselines
def lead_first_document(sentences: Sequence[str], sentence_doc: Sequence[int], k: int = 3) -> list[str]:
    """Lead-k as most multi-document papers define it: the first k sentences of the first document."""
    first = [s for s, d in zip(sentences, sentence_doc) if d == sentence_doc[0]] if len(sentences) else []
    return list(first[:k])


def lead_tokens(sentences: Sequence[str], gold_words: int) -> list[str]:
    """Liu & Lapata's Lead: the first words of the documents back to back, as many as the gold summary
    has (cut inside the last sentence if need be)."""
    out, used = [], 0
    for s in sentences:
        words = s.split()
        if used + len(words) >= gold_words:
            out.append(" ".join(words[: gold_words - used]))
            break
        out.append(s)
        used += len(words)
    return [s for s in out if s]


def tfidf_extract(sentences: Sequence[str], k: int = 3, redundancy: float = 0.5) -> list[str]:
    """An unsupervised extractive baseline (centroid / LexRank-style): sentences by tf-idf cosine to the
    cluster centroid, skipping any that is too similar (cosine > `redundancy`) to one already taken; the
    chosen sentences in score order."""
    if not sentences:
        return []
    scores = tfidf_scores(list(sentences))
    order = np.argsort(-scores, kind="stable").tolist()
    from finetune.mds_data import _bags

    bags = _bags(sentences)

    def cos(a, b) -> float:
        num = sum(c * b.get(w, 0) for w, c in a.items())
        den = np.sqrt(sum(c * c for c in a.values()) * sum(c * c for c in b.values()))
        return num / den if den else 0.0

    chosen: list[int] = []
    for j in order:
        if len(chosen) == k:
            break
        if all(cos(bags[j], bags[c]) <= redundancy for c in chosen):
            chosen.append(j)
    return [sentences[j] for j in chosen]
