"""A real (tiny) stanza neural tokenizer, trained in seconds, so tests can run the neural segmentation path
without the hub: stanza's own trainer on character labels (1 = token end, 2 = sentence end), saved where
`stanza.Pipeline(dir=...)` looks for English tokenizer models, with a resources.json naming it.
The model is far from good; the tests check the plumbing and the sentence boundaries it learns."""
from __future__ import annotations

import json
import random
from pathlib import Path

PARAGRAPHS = [
    [["The", "council", "approved", "the", "budget", "."], ["It", "includes", "money", "for", "schools", "."]],
    [["Critics", "said", "the", "plan", "raises", "taxes", "."], ["The", "mayor", "welcomed", "the", "vote", "."],
     ["Work", "starts", "next", "year", "."]],
    [["Shares", "rose", "3", "%", "on", "Monday", "."], ["Analysts", "expect", "more", "gains", "."]],
]
NO_SPACE_BEFORE = {".", "%"}


def _labelled(paragraph: list[list[str]]) -> tuple[str, str]:
    text, labels = "", ""
    for sentence in paragraph:
        for i, word in enumerate(sentence):
            sep = "" if word in NO_SPACE_BEFORE or not text else " "
            text += sep + word
            labels += "0" * len(sep) + "0" * (len(word) - 1) + ("2" if i == len(sentence) - 1 else "1")
    return text, labels


def build(root: Path, steps: int = 300, seed: int = 0, emb_dim: int = 8, hidden_dim: int = 16) -> Path:
    """Train and install the model under root (root/en/tokenize/tiny.pt + root/resources.json). The sizes:
    tiny for tests; benchmarks/bench_segment.py passes stanza's default architecture (32, 64)."""
    from stanza.models import tokenizer

    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    pairs = [_labelled(p) for _ in range(60) for p in rng.sample(PARAGRAPHS, len(PARAGRAPHS))]
    (root / "train.txt").write_text("\n\n".join(t for t, _ in pairs) + "\n")
    (root / "train.toklabels").write_text("\n\n".join(lab for _, lab in pairs) + "\n")
    (root / "mwt.json").write_text("[]")
    model_dir = root / "en" / "tokenize"
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.main(["--txt_file", str(root / "train.txt"), "--label_file", str(root / "train.toklabels"),
                    "--dev_txt_file", str(root / "train.txt"), "--dev_label_file", str(root / "train.toklabels"),
                    "--mwt_json_file", str(root / "mwt.json"), "--no_use_mwt", "--lang", "en",
                    "--shorthand", "en_tiny", "--emb_dim", str(emb_dim), "--hidden_dim", str(hidden_dim), "--steps", str(steps),
                    "--eval_steps", str(steps + 1), "--batch_size", "8", "--max_seqlen", "60",
                    "--save_dir", str(model_dir), "--save_name", "tiny.pt", "--report_steps", str(steps),
                    "--seed", str(seed)])
    (root / "resources.json").write_text(json.dumps({"en": {
        "lang_name": "English", "packages": {"default": {"tokenize": "tiny"}}, "tokenize": {"tiny": {}},
        "default_processors": {"tokenize": "tiny"}, "default_dependencies": {}}}))
    return root
