"""The model card (README.md) of a Hugging Face folder, from the export's own export.json: what the model is, how
to load it, its data, training stage, steps, validation metrics and commit, and how its inputs differ from the
project's own inference."""
from __future__ import annotations

from typing import Any

from hibert.redact import redact_uri


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if v is None or v == "":
        return "—"
    return str(v)


def _metrics_table(meta: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, dict]] = []
    if isinstance(meta.get("metrics"), dict) and meta["metrics"]:
        rows.append(("exported weights", meta["metrics"]))
    final = meta.get("final_metrics")
    if isinstance(final, dict) and final and final != meta.get("metrics"):
        rows.append((f"last step ({_fmt(meta.get('step'))})", meta["final_metrics"]))
    selected = meta.get("selected_metrics") if isinstance(meta.get("selected_metrics"), dict) else {}
    if len(selected) > 1:
        rows += [(f"selected step {k}", v) for k, v in sorted(selected.items(), key=lambda kv: str(kv[0]))
                 if isinstance(v, dict)]
    if not rows:
        return ["No validation metrics were recorded for this export."]
    keys = sorted({k for _, m in rows for k in m})
    out = ["| weights | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    out += [f"| {name} | " + " | ".join(_fmt(m.get(k)) for k in keys) + " |" for name, m in rows]
    return out


def model_card(model_cfg, meta: dict[str, Any], limits: dict[str, int], architecture: str, config: dict[str, Any],
               source: str | None, notes: list[str]) -> str:
    data = meta.get("data") if isinstance(meta.get("data"), dict) else {}
    seg = data.get("segmenter") if isinstance(data.get("segmenter"), dict) else {}
    tok = data.get("tokenizer") if isinstance(data.get("tokenizer"), dict) else {}
    versions = [f"{name} {seg[key]}" for name, key in (("stanza", "stanza_version"), ("spaCy", "spacy_version"))
                if seg.get(key)]
    head = architecture == "HibertForSentenceLabelling"
    tags = ["hibert", "hierarchical-transformer", "document-encoder"] + (["extractive-summarization"] if head else [])
    front = ["---", "library_name: transformers", "tags:", *[f"- {t}" for t in tags],
             f"pipeline_tag: {'token-classification' if head else 'feature-extraction'}", "---", ""]
    sizes = (f"hidden {model_cfg.hidden}, {model_cfg.layers} sentence-encoder and {model_cfg.layers} document-encoder "
             f"layers, {model_cfg.heads} heads, FFN {model_cfg.ffn_dim}, {model_cfg.activation}, "
             f"{'pre-LN' if model_cfg.norm_first else 'post-LN'}, vocabulary {model_cfg.vocab_size}, "
             f"max_positions {model_cfg.max_positions}")
    what = (f"A HIBERT hierarchical document encoder (Zhang et al. 2019) of size `{model_cfg.name}` ({sizes}), "
            f"trained by the HIBERT platform (`hibert pretrain` / `hibert finetune`): task `{_fmt(meta.get('task'))}`, "
            f"stage `{_fmt(meta.get('stage'))}`.")
    title = f"# HIBERT encoder `{model_cfg.name}`" + (" with its extractive head" if head else "")
    lines = [*front, title, "", what, ""]
    if head:
        sel = config.get("extractive_selection") or {}
        lines += [f"It carries its finetuned extractive head (HIBERT §3.3: a {config.get('sentence_head')} layer over "
                  "each document-level sentence state): `HibertForSentenceLabelling` gives each sentence the "
                  "probability that it belongs to the summary (`scores`)"
                  + (f"; the project extracts the top {sel.get('top_k')} sentences in document order"
                     + (" with trigram blocking" if sel.get("trigram_blocking") else "") if sel else "") + ".", ""]
    lines += [f"Converted by `hibert export-hf` from `{redact_uri(source)}`." if source else
              "Converted by `hibert export-hf`.", ""]
    lines += ["## Use", "", "```python", "from transformers import AutoModel, AutoTokenizer", "",
              'tok = AutoTokenizer.from_pretrained("PATH_OR_REPO", trust_remote_code=True)',
              'model = AutoModel.from_pretrained("PATH_OR_REPO", trust_remote_code=True).eval()',
              'docs = ["First document. Its second sentence.", ["A pre-split", "document."]]',
              'batch = tok(docs, return_tensors="pt")',
              "out = model(**batch)",
              "out.last_hidden_state   # [docs, sentences, H] document-level (context-sensitive) sentence states",
              "out.sentence_vectors    # [docs, sentences, H] sentence vectors: EOS state + sentence position",
              "out.token_states        # [docs, sentences, tokens, H] sentence-level token states",
              "out.sentence_mask       # [docs, sentences] the real sentences"]
    if head:
        lines += ["", "from transformers import AutoModelForTokenClassification",
                  'ext = AutoModelForTokenClassification.from_pretrained("PATH_OR_REPO",',
                  '                                                      trust_remote_code=True).eval()',
                  "ext(**batch).scores     # [docs, sentences] probability of each sentence being in the summary"]
    lines += ["```", "",
              "Input: `input_ids [docs, sentences, tokens]`: each sentence row its SentencePiece ids, then EOS (3), "
              "then PAD (0); `attention_mask` 1 on real tokens (EOS included); `sentence_mask` 1 on real sentences. "
              "Positions count real tokens and sentences only. Outputs are zeros at padding.", "",
              "## Inputs compared with the project's inference", "",
              f"* Sentences are SentencePiece-encoded with the model's own `tokenizer.model`, cut to "
              f"{limits['max_sentence_tokens']} subwords, and EOS is appended; empty sentences are dropped; documents "
              f"of more than {limits['max_doc_sentences']} sentences are cut into chunks of that many "
              "(`document_index` maps rows to input documents; `long_documents=\"truncate\"` keeps the first chunk, as "
              "the project's abstractive encoder reads): as `hibert summarize` does.",
              "* Sentence splitting: PTB-tokenized text (lowercased, with `-lrb-` and split-off `n't`) is split and "
              "detokenized with the project's rules, giving its sentences exactly. Other text is split by a simple "
              "rule (. ! ? before a capital, a digit or a quote), where the project runs its "
              f"`{_fmt(seg.get('kind'))}` segmenter" + (f" ({', '.join(versions)})" if versions else "")
              + ": pass pre-split sentences (a list of strings per document) for the project's exact input.",
              f"* The project refuses documents over {limits['max_doc_chars']:,} characters; the tokenizer does not.",
              ""]
    lines += ["## Training", "", "| | |", "|---|---|"]
    rows = [("task", meta.get("task")), ("stage", meta.get("stage")), ("optimizer steps", meta.get("step")),
            ("exported weights: steps", ", ".join(map(str, meta.get("selected_steps") or [])) or None),
            ("selected by", meta.get("selection_metric")),
            ("initialised from", meta.get("init") or "random init"),
            ("world size", meta.get("world_size")), ("dataset manifest", meta.get("dataset_manifest")),
            ("config hash", meta.get("config_hash")), ("git commit", meta.get("git_commit")),
            ("MLflow run", meta.get("mlflow_run_id"))]
    lines += [f"| {k} | {_fmt(redact_uri(v) if isinstance(v, str) else v)} |" for k, v in rows]
    lines += ["", "## Validation metrics", "", *_metrics_table(meta), "", "## Data", "", "| | |", "|---|---|"]
    drows = [("kind", data.get("kind")),
             ("max sentence tokens", limits["max_sentence_tokens"]),
             ("max document sentences", limits["max_doc_sentences"]),
             ("max document characters", f"{limits['max_doc_chars']:,}"),
             ("segmenter", f"{seg.get('kind')} ({', '.join(versions)})" if seg.get("kind") and versions
              else seg.get("kind")),
             ("tokenizer", " ".join(x for x in ("SentencePiece", tok.get("model_type"),
                                                 f"{tok.get('vocab_size')} pieces") if x) if tok else None),
             ("tokenizer sha256", tok.get("sha256")), ("synthetic data", data.get("synthetic"))]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in drows]
    if notes:
        lines += ["", "## Notes", "", *[f"* {n}" for n in notes]]
    lines += ["", "## Files", "",
              "`config.json`, `model.safetensors` (fp32), `configuration_hibert.py` / `modeling_hibert.py` / "
              "`tokenization_hibert.py` (remote code: torch, sentencepiece and transformers only), `tokenizer.model`, "
              "`tokenizer_config.json`, `hibert_export.json` (the export's full provenance).", "",
              "## Citation", "", "```bibtex",
              "@inproceedings{zhang-etal-2019-hibert,",
              "  title = {{HIBERT}: Document Level Pre-training of Hierarchical Bidirectional Transformers for "
              "Document Summarization},",
              "  author = {Zhang, Xingxing and Wei, Furu and Zhou, Ming},",
              "  booktitle = {Proceedings of the 57th Annual Meeting of the Association for Computational "
              "Linguistics},",
              "  year = {2019}, pages = {5059--5069}", "}", "```", ""]
    return "\n".join(lines)

