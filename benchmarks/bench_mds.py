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
Peak memory: on CPU the growth of the process's peak resident set (VmHWM) during one step, each measurement in
a fresh process (no allocator cache from another configuration); on CUDA the growth of torch's peak allocated
memory during one step (exact: the caching allocator counts what tensors hold). Growth exponents:
log(t(last)/t(first)) / log(last/first) over the lengths, 1 = linear, 2 = quadratic. Ratios and exponents come
from one run (machines are noisy).

    python benchmarks/bench_mds.py                 # 2 CPU threads, H=256
    python benchmarks/bench_mds.py --device cuda --precision bf16 --hidden 512 --batch 8 \
        --lengths 800 1600 3000 6000 --out benchmarks/results/bench_mds_cuda.json
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


def enc_cfg(args, max_positions: int | None = None) -> ModelConfig:
    """token-flat reads the whole input as one sentence: positions up to the longest length."""
    longest = max(getattr(args, "lengths", LENGTHS))
    return ModelConfig(name="bench", hidden=args.hidden, layers=2, heads=4, vocab_size=8000, dropout=0.0,
                       max_positions=max_positions or 128 * math.ceil((longest + 72) / 128))


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
    device = torch.device(getattr(args, "device", "cpu"))
    return model.to(device), batch.to(device)


def step(model, batch, precision: str = "fp32") -> None:
    model.zero_grad(set_to_none=True)
    cuda = next(model.parameters()).is_cuda
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and precision == "bf16"):
        loss = model(batch).loss
    loss.backward()
    if cuda:
        torch.cuda.synchronize()


def timed(kind: str, args, tokens: int) -> tuple[float, float | None]:
    """(best seconds per step, on CUDA the growth of peak allocated memory during one step in MiB)."""
    torch.manual_seed(0)
    model, batch = make(kind, args, tokens)
    step(model, batch, args.precision)  # warm-up (kernel selection, the allocator's first blocks)
    best = math.inf
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        step(model, batch, args.precision)
        best = min(best, time.perf_counter() - t0)
    growth = None
    if args.device == "cuda":
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step(model, batch, args.precision)
        growth = (torch.cuda.max_memory_allocated() - before) / 2**20
    del model, batch
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return best, growth


def _kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def peak_child(kind: str, hidden: int, batch: int, tokens: int, longest: int) -> None:
    """In a fresh process: the growth of the peak resident set during one training step (MiB)."""
    args = argparse.Namespace(hidden=hidden, batch=batch, lengths=(longest,), device="cpu")
    torch.manual_seed(0)
    model, b = make(kind, args, tokens)
    before = _kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    step(model, b)
    print(json.dumps({"peak_mib": (_kib("VmHWM") - before) / 1024}))


def peak(kind: str, args, tokens: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(args.hidden), str(args.batch), str(tokens),
                          str(max(args.lengths))],
                         capture_output=True, text=True, check=True, env={"OMP_NUM_THREADS": str(args.threads),
                                                                           "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def ranker_rate(args) -> float:
    device = torch.device(args.device)
    model = HibertRanker(enc_cfg(args, 128)).eval().to(device)
    clusters = [cluster(1600, s) for s in range(args.batch * 2)]
    inp = ranker_input(clusters, [None] * len(clusters)).to(device)  # no titles: each centroid conditions
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16,
                                         enabled=args.device == "cuda" and args.precision == "bf16"):
        model(inp)
        if args.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            model(inp)
        if args.device == "cuda":
            torch.cuda.synchronize()
    return len(clusters) * args.repeats / (time.perf_counter() - t0)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "2")))
        peak_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=2, help="clusters per step")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="source tokens per cluster")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast (CUDA)")
    p.add_argument("--out", default=None, help="default: benchmarks/results/bench_mds_<device>.json")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    args.out = args.out or str(REPO / "benchmarks" / "results" / f"bench_mds_{args.device}.json")
    lengths = tuple(sorted(args.lengths))
    torch.set_num_threads(args.threads)
    rows = {}
    for kind in KINDS:
        for n in lengths:
            t, gpu_peak = timed(kind, args, n)
            rows[(kind, n)] = {"seconds": t, "tokens_per_s": args.batch * (n + 100) / t,
                               "peak_mib": gpu_peak if gpu_peak is not None else peak(kind, args, n)}
            print(f"{kind:13s} {n:5d} tokens: {t:7.3f} s/step  {rows[(kind, n)]['tokens_per_s']:8.0f} tokens/s  "
                  f"peak +{rows[(kind, n)]['peak_mib']:7.1f} MiB", flush=True)
    lo, hi = lengths[0], lengths[-1]
    growth = {kind: {m: math.log(rows[(kind, hi)][k] / rows[(kind, lo)][k]) / math.log(hi / lo) if hi > lo else None
                     for m, k in (("time", "seconds"), ("memory", "peak_mib"))} for kind in KINDS}
    rate = ranker_rate(args)
    print("\n| model | " + " | ".join(f"{n} tok: s/step, MiB" for n in lengths) + " | time growth | memory growth |")
    print("|---|" + "---|" * (len(lengths) + 2))
    exp = lambda v: "-" if v is None else f"n^{v:.2f}"  # noqa: E731
    for kind in KINDS:
        cells = [f"{rows[(kind, n)]['seconds']:.3f}, {rows[(kind, n)]['peak_mib']:.0f}" for n in lengths]
        print(f"| {kind} | " + " | ".join(cells) + f" | {exp(growth[kind]['time'])} | {exp(growth[kind]['memory'])} |")
    print(f"\nranker: {rate:.1f} clusters/s (1,600-token clusters, inference)")
    if args.device == "cuda":
        print(f"GPU: {torch.cuda.get_device_name()}; peak memory: torch's peak allocated growth during a step")
    result = {"machine": machine(), "settings": vars(args), "lengths": lengths,
              "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
              "rows": {f"{k}@{n}": v for (k, n), v in rows.items()}, "growth_exponent": growth,
              "ranker_clusters_per_s": rate}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
