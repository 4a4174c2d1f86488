"""The card's segmenter (stanza's neural tokenizer) against the offline default (stanza's spaCy variant):
words/s per core on the shared news corpora, sentence-boundary agreement, and what each costs for GIGA-CM.

The neural path needs stanza's English tokenizer model (`stanza.download('en', model_dir=DIR)` where the hub
is reachable; pass `--stanza-dir DIR`). Without it, the benchmark trains a stand-in with stanza's own trainer
and its default architecture (character embeddings 32, hidden 64, conv filters 1,9, one hierarchical BiLSTM
layer) on a few hand-labelled paragraphs (tests/stanza_tiny.py): inference costs the same per character whatever
the model learned,
so its speed stands for the real model's (stanza's published models may set other sizes: then this is an
estimate), while its agreement with the spaCy variant says nothing about the real model's and is reported as
such. Both run through the project's own segmenters (data_prep/segment.py), one thread each (words/s/core).
The spaCy variant runs twice: on its fast path (`fast: true`, the default: spaCy's Language over the paragraphs)
and through stanza's Document objects (`fast: false`), whose sentences and tokens are the same. Start-up: a fresh
process that builds the default segmenter and segments one paragraph, timed from outside (interpreter start
included), on the direct path (stanza's variant built without importing stanza or torch, data_prep/spacy_light.py)
and through `stanza.Pipeline`, against the interpreter alone; best of `--rounds`.

    python benchmarks/bench_segment.py                        # stand-in model, CPU
    python benchmarks/bench_segment.py --stanza-dir ~/stanza_resources            # the real English model
    python benchmarks/bench_segment.py --stanza-dir ~/stanza_resources --use-gpu  # stanza on the GPU
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO / "benchmarks"))

from workload import GIGA_CM_WORDS, machine, write_results  # noqa: E402


def corpus(docs: int, seed: int) -> list[list[str]]:
    """Reuters-21578 bodies (raw newswire) and CNN/DM articles (PTB-tokenized, lowercased), paragraphs."""
    rng = random.Random(seed)
    reuters = [json.loads(line)["body"] for line in open(SHARED / "open_domain" / "reuters21578.jsonl")]
    cnndm = [json.loads(line)["article"] for line in open(SHARED / "in_domain" / "cnndm_train.jsonl")]
    reuters = [t for t in reuters if t and t.strip()]
    picked = rng.sample(reuters, docs // 2) + rng.sample(cnndm, docs - docs // 2)
    return [[" ".join(p.split()) for p in t.split("\n    ") if p.strip()] for t in picked]


def boundaries(sentences: list[list[tuple[str, int]]]) -> list[set[int]]:
    """Per document, the offsets (in its non-space characters) where a sentence ends: comparable across
    segmenters whatever whitespace each keeps."""
    out = []
    for doc in sentences:
        ends, pos = set(), 0
        for text, _ in doc:
            pos += sum(not c.isspace() for c in text)
            ends.add(pos)
        out.append(ends)
    return out


def agreement(a: list[set[int]], b: list[set[int]]) -> dict:
    both = sum(len(x & y) for x, y in zip(a, b))
    na, nb = sum(map(len, a)), sum(map(len, b))
    p, r = both / max(nb, 1), both / max(na, 1)
    return {"boundary_f1": 2 * p * r / max(p + r, 1e-9), "sentences_spacy": na, "sentences_neural": nb}


def train_stand_in(root: Path, steps: int, seed: int) -> Path:
    """stanza's trainer with its default architecture (character embeddings 32, hidden 64) on the tests'
    hand-labelled paragraphs (tests/stanza_tiny.py), installed where stanza.Pipeline(dir=root) finds it."""
    sys.path.insert(0, str(REPO / "tests"))
    from stanza_tiny import build

    return build(root, steps=steps, seed=seed, emb_dim=32, hidden_dim=64)


def timed(segmenter, docs: list[list[str]], rounds: int) -> tuple[float, list]:
    segmenter.segment(docs[:4])  # warm-up
    best, out = float("inf"), []
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = segmenter.segment(docs)
        best = min(best, time.perf_counter() - t0)
    return best, out


STARTUP = """
from hibert.config.data import SegmenterConfig
from hibert.data_prep.segment import SpacySegmenter, direct_fast_path
cfg = SegmenterConfig(kind="spacy", fast={fast})
assert direct_fast_path(cfg) == {fast}, "the direct path needs the verified stanza version"
SpacySegmenter(cfg).segment([["The first sentence is here. And a second one follows."]])
import sys
assert not {fast} or not {{"stanza", "torch"}} & set(sys.modules), "the direct path loaded stanza or torch"
"""


def startup(rounds: int) -> dict:
    """Seconds a fresh process takes to segment one paragraph, interpreter start included (best of `rounds`):
    the direct path, through stanza.Pipeline, and the interpreter alone."""
    cases = {"direct path (no stanza, no torch)": STARTUP.format(fast=True),
             "through stanza Pipeline": STARTUP.format(fast=False), "python alone": "pass"}
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):
        for name, code in cases.items():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: {"seconds": t} for name, t in best.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=400, help="documents timed (half Reuters, half CNN/DM)")
    p.add_argument("--steps", type=int, default=300, help="training steps of the stand-in model")
    p.add_argument("--stanza-dir", type=Path, default=None, help="stanza resources with the real English model")
    p.add_argument("--use-gpu", action="store_true", help="the neural segmenter on the GPU")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "bench_segment_cpu.json")
    args = p.parse_args()

    import torch

    from hibert.config.data import SegmenterConfig
    from hibert.data_prep.segment import NeuralSegmenter, SpacySegmenter

    torch.set_num_threads(1)  # words/s per core
    docs = corpus(args.docs, args.seed)
    words = sum(len(p.split()) for d in docs for p in d)
    tmp = tempfile.TemporaryDirectory(prefix="bench-segment-")
    model = "published English model"
    stanza_dir = args.stanza_dir
    if stanza_dir is None:
        model = f"stand-in: stanza's default architecture, {args.steps} steps on the tests' labelled paragraphs"
        t0 = time.time()
        stanza_dir = train_stand_in(Path(tmp.name) / "stanza", args.steps, args.seed)
        print(f"[segment] stand-in model trained in {time.time() - t0:.0f} s", flush=True)
    spacy_s, spacy_out = timed(SpacySegmenter(SegmenterConfig(kind="spacy")), docs, args.rounds)
    full_s, full_out = timed(SpacySegmenter(SegmenterConfig(kind="spacy", fast=False)), docs, args.rounds)
    assert full_out == spacy_out, "the fast path's sentences differ from stanza's Document objects'"
    neural = NeuralSegmenter(SegmenterConfig(kind="neural", stanza_dir=str(stanza_dir), use_gpu=args.use_gpu))
    neural_s, neural_out = timed(neural, docs, args.rounds)
    rows = {"spacy variant (default)": spacy_s, "spacy variant, fast: false": full_s,
            f"neural ({'GPU' if args.use_gpu else 'CPU'})": neural_s}
    result = {"machine": machine(), "documents": len(docs), "words": words, "model": model,
              "rows": {name: {"seconds": s, "words_per_s_per_core": words / s,
                              "giga_cm_core_hours": GIGA_CM_WORDS / (words / s) / 3600} for name, s in rows.items()},
              "agreement": agreement(boundaries(spacy_out), boundaries(neural_out)),
              "agreement_meaningful": args.stanza_dir is not None,
              "fast_path_speedup": full_s / spacy_s, "startup": startup(max(3, args.rounds))}
    print(f"\n{len(docs)} documents, {words:,} words; neural model: {model}")
    print(f"{'segmenter':<26} {'words/s/core':>13} {'GIGA-CM core-hours':>19}")
    for name, r in result["rows"].items():
        print(f"{name:<26} {r['words_per_s_per_core']:>13,.0f} {r['giga_cm_core_hours']:>19,.0f}")
    for name, r in result["startup"].items():
        print(f"start-up, {name}: {r['seconds']:.2f} s")
    a = result["agreement"]
    print(f"sentence-boundary F1, neural vs spaCy variant: {a['boundary_f1']:.3f} ({a['sentences_neural']} vs "
          f"{a['sentences_spacy']} sentences)" + ("" if result["agreement_meaningful"] else
                                                  " — the stand-in's, not the real model's"))
    return write_results(args.out, result)


if __name__ == "__main__":
    sys.exit(main())
