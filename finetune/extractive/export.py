"""Load a finetuned extractive model from its export and score documents (single process, no DeepSpeed)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from hibert.finetune.base.exports import load_head_export
from hibert.json_files import read_json_object
from hibert.modeling import HibertExtractive, pack_documents
from hibert.runtime.batching import doc_costs, plan_epoch


def sentence_scores(model_out: torch.Tensor) -> torch.Tensor:
    """Probability that each sentence belongs to the summary ([S, 2] softmax logits or [S] sigmoid)."""
    if model_out.ndim == 2:
        return model_out.float().softmax(-1)[:, 1]
    return model_out.float().sigmoid()



def load_extractive(export_dir: Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """(extractive model in eval mode, settings incl. its trained k / trigram blocking) from an export."""
    export_dir = Path(export_dir)
    model, meta, model_cfg = load_head_export(
        export_dir, device, weights="head.safetensors", required=("head.safetensors",), build=HibertExtractive,
        into=lambda m: m.head,
        missing=lambda d, name: f"{d} holds an encoder but no extractive head ({name}): pass a model produced by "
                                "`hibert finetune`")
    settings_path = export_dir / "extractive.json"
    settings = read_json_object(settings_path) if settings_path.is_file() else {}
    return model, {**meta, "selection": settings, "model": model_cfg.model_dump()}


@torch.no_grad()
def score_documents(model: torch.nn.Module, docs: list[list[np.ndarray]], device: torch.device | str = "cpu",
                    batch_tokens: int = 16384) -> list[np.ndarray]:
    """Sentence scores for each document (list of encoded sentences), batched by token budget."""
    if not docs:
        return []
    costs = doc_costs(np.array([sum(len(s) for s in d) for d in docs]), np.array([len(d) for d in docs]))
    plan = plan_epoch(costs, seed=0, epoch=0, batch_tokens=batch_tokens, max_docs=512, world=1, accum=1)
    out: list[np.ndarray | None] = [None] * len(docs)
    for idx in plan.batches:
        batch = pack_documents([docs[i] for i in idx.tolist()]).to(device)
        scores = sentence_scores(model(batch)).cpu().numpy()
        start = 0
        for i in idx.tolist():
            out[i] = scores[start:start + len(docs[i])]
            start += len(docs[i])
    return out  # type: ignore[return-value]


def score_split(model: torch.nn.Module, dataset, device: torch.device | str = "cpu") -> dict[int, np.ndarray]:
    docs = [dataset[i] for i in range(len(dataset))]
    return dict(enumerate(score_documents(model, docs, device)))
