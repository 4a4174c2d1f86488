"""An encoder export (encoder.safetensors, model.json, tokenizer.model, export.json) -> a Hugging Face folder:
config.json, model.safetensors, the remote code (remote/*.py, copied as they are), tokenizer.model with its
tokenizer_config.json, hibert_export.json (the export's own provenance) and a model card (README.md).

`transformers.AutoModel.from_pretrained(folder, trust_remote_code=True)` loads it; `huggingface-cli upload REPO
folder .` publishes it. Nothing here imports transformers: the remote code is copied, never imported.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hibert.errors import UserError
from hibert.json_files import DAMAGED, read_json_object

REMOTE = Path(__file__).resolve().with_name("remote")
REMOTE_FILES = ("configuration_hibert.py", "modeling_hibert.py", "tokenization_hibert.py")
WEIGHTS = "model.safetensors"
PROVENANCE = "hibert_export.json"
BASE_PREFIX = "hibert."       # HibertForSentenceLabelling.base_model_prefix: the encoder's keys in a folder with a head
HEAD_TASK = "extractive"      # the one head the remote code holds (HibertForSentenceLabelling)
HEAD_WEIGHTS = "head.safetensors"
SELECTION = "extractive.json"
LIMITS = {"max_sentence_tokens": 50, "max_doc_sentences": 30, "max_doc_chars": 1_000_000}   # prep's defaults


@dataclass
class HfFolder:
    """What `export_hf` wrote."""
    out: Path
    architecture: str                      # HibertModel or HibertForSentenceLabelling
    task: str | None                       # the export's task (export.json)
    notes: list[str] = field(default_factory=list)


def _limits(export_dir: Path, meta: dict[str, Any]) -> dict[str, int]:
    data = meta.get("data") if isinstance(meta.get("data"), dict) else {}
    given = data.get("limits") if isinstance(data.get("limits"), dict) else {}
    out = {}
    for key, default in LIMITS.items():
        v = given.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"{export_dir / 'export.json'}: data.limits.{key} is {str(v)[:60]!r}, not a positive "
                            f"integer: {DAMAGED}")
        out[key] = v
    return out


def _head(export_dir: Path, hidden: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the extractive head's weights, its config entries) of a finetuned extractive export."""
    from hibert.runtime.export import read_weights   # lazy: torch

    head = read_weights(export_dir / HEAD_WEIGHTS)
    w, b = head.get("weight"), head.get("bias")
    if w is None or b is None or set(head) != {"weight", "bias"} or w.ndim != 2 or w.shape[1] != hidden \
            or tuple(b.shape) != (w.shape[0],):
        shapes = {k: tuple(v.shape) for k, v in head.items()}
        raise UserError(f"{export_dir / HEAD_WEIGHTS} is not an extractive head of hidden size {hidden} "
                        f"(tensors {shapes}): {DAMAGED}")
    n = int(w.shape[0])
    cfg: dict[str, Any] = {"sentence_head": "sigmoid" if n == 1 else "softmax"}
    if n > 1:
        labels = {0: "not_in_summary", 1: "in_summary"} if n == 2 else {i: f"LABEL_{i}" for i in range(n)}
        cfg["id2label"] = {str(i): v for i, v in labels.items()}
        cfg["label2id"] = {v: i for i, v in labels.items()}
    path = export_dir / SELECTION
    if path.is_file():
        sel = read_json_object(path)
        cfg["extractive_selection"] = {k: sel[k] for k in ("top_k", "trigram_blocking") if k in sel}
    return {"classifier.weight": w, "classifier.bias": b}, cfg


def hf_config(model_cfg, meta: dict[str, Any], head_cfg: dict[str, Any] | None) -> dict[str, Any]:
    """config.json: HibertConfig's fields from model.json, the auto classes, the export's provenance in brief."""
    auto = {"AutoConfig": "configuration_hibert.HibertConfig", "AutoModel": "modeling_hibert.HibertModel",
            "AutoTokenizer": ["tokenization_hibert.HibertTokenizer", None]}
    if head_cfg is not None:
        auto["AutoModelForTokenClassification"] = "modeling_hibert.HibertForSentenceLabelling"
    cfg: dict[str, Any] = {
        "architectures": ["HibertForSentenceLabelling" if head_cfg is not None else "HibertModel"],
        "auto_map": auto, "model_type": "hibert",
        "vocab_size": model_cfg.vocab_size, "hidden": model_cfg.hidden, "layers": model_cfg.layers,
        "heads": model_cfg.heads, "ffn": model_cfg.ffn_dim, "dropout": model_cfg.dropout,
        "max_positions": model_cfg.max_positions, "norm_first": model_cfg.norm_first,
        "activation": model_cfg.activation, "layer_norm_eps": 1e-5,
        "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3, "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "hibert": {"name": model_cfg.name, **{k: meta.get(k) for k in
                   ("task", "stage", "step", "git_commit", "dataset_manifest", "config_hash", "mlflow_run_id")}},
    }
    if head_cfg is not None:
        cfg.update(head_cfg)
    return cfg


def tokenizer_config(limits: dict[str, int], max_positions: int) -> dict[str, Any]:
    return {"tokenizer_class": "HibertTokenizer",
            "auto_map": {"AutoTokenizer": ["tokenization_hibert.HibertTokenizer", None]},
            "max_sentence_tokens": limits["max_sentence_tokens"], "max_doc_sentences": limits["max_doc_sentences"],
            "long_documents": "chunk", "model_max_length": max_positions, "clean_up_tokenization_spaces": False,
            "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
            "mask_token": "[MASK]", "sep_token": "[SEP]"}


SPECIAL_TOKENS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
                  "mask_token": "[MASK]", "sep_token": "[SEP]"}


def export_hf(export_dir: Path, out: Path, *, encoder_only: bool = False, force: bool = False,
              source: str | None = None) -> HfFolder:
    """Write the Hugging Face folder of the encoder export `export_dir` at `out` (beside it as `<out>.partial`,
    renamed into place when complete). A finetuned extractive export also gets its head
    (HibertForSentenceLabelling) unless `encoder_only`; any other head's export gives its encoder only.
    `out` must be absent or empty unless `force` (then it is replaced). `source`: the reference the user gave
    (models:/...), for the model card."""
    from safetensors.torch import save_file            # lazy: torch

    from hibert.runtime.export import TOKENIZER, read_export

    export_dir, out = Path(export_dir), Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"{out} is not empty: pass --force to replace it, or name another directory")
    if out.resolve() == export_dir.resolve() or export_dir.resolve() in out.resolve().parents:
        raise UserError(f"{out} is inside the export {export_dir}: write the Hugging Face folder elsewhere")
    state, model_cfg, meta = read_export(export_dir)   # weights, model.json, export.json, tokenizer sha checked
    if not (export_dir / TOKENIZER).is_file():
        raise UserError(f"{export_dir / TOKENIZER} is missing: the Hugging Face folder needs the model's "
                        f"SentencePiece tokenizer: {DAMAGED}")
    limits = _limits(export_dir, meta)
    if max(limits["max_sentence_tokens"] + 1, limits["max_doc_sentences"]) > model_cfg.max_positions:
        raise UserError(f"{export_dir / 'export.json'}: data.limits ({limits['max_sentence_tokens']} tokens, "
                        f"{limits['max_doc_sentences']} sentences) exceed the model's max_positions "
                        f"{model_cfg.max_positions}: {DAMAGED}")
    task = meta.get("task") if isinstance(meta.get("task"), str) else None
    notes: list[str] = []
    head_state, head_cfg = None, None
    if task == HEAD_TASK and not encoder_only:
        if not (export_dir / HEAD_WEIGHTS).is_file():
            raise UserError(f"{export_dir} is an extractive export without its {HEAD_WEIGHTS}: {DAMAGED}")
        head_state, head_cfg = _head(export_dir, model_cfg.hidden)
    elif task == HEAD_TASK:
        notes.append("the extractive head is left out (--encoder-only): the folder holds the encoder")
    elif task not in (None, "masked_sentence"):
        notes.append(f"the export's {task} head has no Hugging Face class here: the folder holds its encoder only")

    weights = {k: v.contiguous() for k, v in state.items()}
    if head_state is not None:
        weights = {BASE_PREFIX + k: v for k, v in weights.items()}
        weights.update({k: v.float().contiguous() for k, v in head_state.items()})

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        save_file(weights, str(partial / WEIGHTS), metadata={"format": "pt"})
        cfg = hf_config(model_cfg, meta, head_cfg)
        (partial / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        shutil.copymode(partial / "config.json", partial / WEIGHTS)   # safetensors writes 0600: readable like the rest
        for name in REMOTE_FILES:
            shutil.copyfile(REMOTE / name, partial / name)
        shutil.copyfile(export_dir / TOKENIZER, partial / "tokenizer.model")
        (partial / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config(limits, model_cfg.max_positions), indent=2) + "\n")
        (partial / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS, indent=2) + "\n")
        (partial / PROVENANCE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        from hibert.hf_export.card import model_card

        architecture = cfg["architectures"][0]
        (partial / "README.md").write_text(model_card(model_cfg, meta, limits, architecture, cfg, source, notes))
        if out.exists():
            old = out.with_name(out.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            partial.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return HfFolder(out=out, architecture=architecture, task=task, notes=notes)
