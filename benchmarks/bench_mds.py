"""Multi-document models as the input grows (Liu & Lapata 2019's claim: a hierarchical encoder scales to long
inputs where flat attention does not): teacher-forced training steps (forward + backward, encoder + decoder)
at 800 -> 1,600 -> 3,000 source tokens per cluster, and the ranker's clusters/s.

Three encoders under the same decoder (2 layers, 100 target tokens), random weights and ids (only shapes
matter for speed), units of 5 sentences x 20 tokens:
  * hierarchical: HibertMDS — HIBERT over each unit (attention within sentences, then over a unit's sentences)
    + 2 global layers across units (attention over unit vectors);
  * hibert-flat: HibertAbstractive over the same units back to back as one document (the platform's flat
    baseline: token attention within sentences, document attention over all sentences of the cluster);
  * token-flat: HibertAbstractive over the whole input as ONE sequence (full token self-attention, the flat
    transformer of Liu & Lapata), positions extended to 3,072.
Peak memory: the growth of the process's peak resident set (VmHWM) during one step, each measurement in a
fresh process (no allocator cache from another configuration). Growth exponents: log(t(3000)/t(800)) /
log(3000/800), 1 = linear, 2 = quadratic. Ratios and exponents come from one run (machines are noisy).

    python benchmarks/bench_mds.py                 # 2 CPU threads, H=256
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from hibert.config.abstractive import DecoderConfig  # noqa: E402
from hibert.config.mds import MDSConfig  # noqa: E402
from hibert.config.model import ModelConfig  # noqa: E402
from hibert.finetune.abstractive.data import make_abstractive_batch, make_mds_batch  # noqa: E402
from hibert.modeling.abstractive import HibertAbstractive  # noqa: E402
from hibert.modeling.mds import HibertMDS  # noqa: E402
from hibert.modeling.ranker import HibertRanker, ranker_input  # noqa: E402
from workload import machine  # noqa: E402

LENGTHS = (800, 1600, 3000)
KINDS = ("hierarchical", "hibert-flat", "token-flat")


def enc_cfg(args, max_positions: int = 3072) -> ModelConfig:
    return ModelConfig(name="bench", hidden=args.hidden, layers=2, heads=4, vocab_size=8000, dropout=0.0,
                       max_positions=max_positions)


def cluster(tokens: int, seed: int) -> list[list[np.ndarray]]:
    """Units of 5 sentences of 19 words (+ EOS = 20 tokens): tokens / 100 units."""
    rng = np.random.default_rng(seed)
    return [[rng.integers(6, 8000, 19) for _ in range(5)] for _ in range(tokens // 100)]


def make(kind: str, args, tokens: int):
    dec = DecoderConfig(layers=2, dropout=0.0, max_positions=128, cross_attention="flat")
    clusters = [cluster(tokens, s) for s in range(args.batch)]
    targets = [np.random.default_rng(99 + s).integers(6, 8000, 99) for s in range(args.batch)]
    if kind == "hierarchical":
        model = HibertMDS(enc_cfg(args), dec, MDSConfig(global_layers=2, max_units=64))
        batch = make_mds_batch(clusters, targets)
    elif kind == "hibert-flat":
        model = HibertAbstractive(enc_cfg(args), dec)
        batch = make_abstractive_batch([[s for u in c for s in u] for c in clusters], targets)
    else:  # the whole input as one sentence: full token attention
        model = HibertAbstractive(enc_cfg(args), dec)
        batch = make_abstractive_batch([[np.concatenate([s for u in c for s in u])[: tokens - 1]] for c in clusters],
                                       targets)
    return model, batch


def step(model, batch) -> None:
    model.zero_grad(set_to_none=True)
    model(batch).loss.backward()


def timed(kind: str, args, tokens: int) -> float:
    torch.manual_seed(0)
    model, batch = make(kind, args, tokens)
    step(model, batch)  # warm-up
    best = math.inf
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        step(model, batch)
        best = min(best, time.perf_counter() - t0)
    return best


def _kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def peak_child(kind: str, hidden: int, batch: int, tokens: int) -> None:
    """In a fresh process: the growth of the peak resident set during one training step (MiB)."""
    args = argparse.Namespace(hidden=hidden, batch=batch)
    torch.manual_seed(0)
    model, b = make(kind, args, tokens)
    before = _kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    step(model, b)
    print(json.dumps({"peak_mib": (_kib("VmHWM") - before) / 1024}))


def peak(kind: str, args, tokens: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(args.hidden), str(args.batch), str(tokens)],
                         capture_output=True, text=True, check=True, env={"OMP_NUM_THREADS": str(args.threads),
                                                                           "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def ranker_rate(args) -> float:
    model = HibertRanker(enc_cfg(args, 128)).eval()
    clusters = [cluster(1600, s) for s in range(args.batch * 2)]
    inp = ranker_input(clusters, [None] * len(clusters))  # no titles: each cluster's centroid conditions
    with torch.no_grad():
        model(inp)
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            model(inp)
    return len(clusters) * args.repeats / (time.perf_counter() - t0)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "2")))
        peak_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=2, help="clusters per step")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "bench_mds_cpu.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = {}
    for kind in KINDS:
        for n in LENGTHS:
            t = timed(kind, args, n)
            rows[(kind, n)] = {"seconds": t, "tokens_per_s": args.batch * (n + 100) / t,
                               "peak_mib": peak(kind, args, n)}
            print(f"{kind:13s} {n:5d} tokens: {t:7.3f} s/step  {rows[(kind, n)]['tokens_per_s']:8.0f} tokens/s  "
                  f"peak +{rows[(kind, n)]['peak_mib']:7.1f} MiB", flush=True)
    growth = {kind: {"time": math.log(rows[(kind, 3000)]["seconds"] / rows[(kind, 800)]["seconds"]) / math.log(3000 / 800),
                     "memory": math.log(rows[(kind, 3000)]["peak_mib"] / rows[(kind, 800)]["peak_mib"]) / math.log(3000 / 800)}
              for kind in KINDS}
    rate = ranker_rate(args)
    print("\n| model | " + " | ".join(f"{n} tok: s/step, MiB" for n in LENGTHS) + " | time growth | memory growth |")
    print("|---|" + "---|" * (len(LENGTHS) + 2))
    for kind in KINDS:
        cells = [f"{rows[(kind, n)]['seconds']:.3f}, {rows[(kind, n)]['peak_mib']:.0f}" for n in LENGTHS]
        print(f"| {kind} | " + " | ".join(cells) + f" | n^{growth[kind]['time']:.2f} | n^{growth[kind]['memory']:.2f} |")
    print(f"\nranker: {rate:.1f} clusters/s (1,600-token clusters, inference)")
    result = {"machine": machine(), "settings": vars(args), "lengths": LENGTHS,
              "rows": {f"{k}@{n}": v for (k, n), v in rows.items()}, "growth_exponent": growth,
              "ranker_clusters_per_s": rate}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
