"""Packed vs padded HIBERT pretraining step: forward + backward throughput on real CNN/DM document shapes.

Both layouts run the SAME weights on the SAME documents: the padding-free packing of `modeling` and the
classic [B, 30, 50(+1)] padded layout. Only lengths matter, so token ids are random. Before timing, the
two layouts' losses on the first batch are compared (eval mode) to show they compute the same function.

    python benchmarks/bench_modeling.py --device cpu --size hibert_s --docs 8 --steps 3 --warmup 1 --threads 1
    python benchmarks/bench_modeling.py --device cuda --dtype bf16 --size hibert_m --docs 128 --steps 10 --warmup 3 --compile
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a plain checkout, installed or not

from hibert.config import load_config
from hibert.tokens import MASK_ID
from hibert.modeling import (HibertForPretraining, PretrainBatch, count_parameters, flops_per_batch,
                      make_padded_pretrain_batch, make_pretrain_batch)
from workload import run_command, source_revision  # benchmarks/ is the script's own folder

DEFAULT_DATA = [REPO.parent / "shared/data/in_domain/cnndm_train.jsonl", REPO / "samples/cnndm_train_sample.jsonl"]
MAX_TOKENS, MAX_SENTENCES, MASK_RATE = 50, 30, 0.15


def read_chunks(path: Path, vocab_size: int, seed: int) -> list[list[np.ndarray]]:
    """Document chunks as the pipeline cuts them: sentences split at ' . ', whitespace tokens, at most 50
    tokens a sentence and 30 sentences a chunk. Ids are random: only the lengths are real."""
    rng = np.random.default_rng(seed)
    chunks = []
    for line in path.read_text(encoding="utf-8").splitlines():
        article = json.loads(line)["article"]
        sentences = [s.split() + ["."] for s in re.split(r" \. ", article.strip().rstrip(" .")) if s.strip()]
        lens = [min(len(s), MAX_TOKENS) for s in sentences]
        for start in range(0, len(lens), MAX_SENTENCES):
            chunks.append([rng.integers(6, vocab_size, n) for n in lens[start:start + MAX_SENTENCES]])
    return chunks


def mask_documents(chunks: list[list[np.ndarray]], rng: random.Random):
    """15% of each chunk's sentences (at least one) become [MASK]s and are the targets (lengths are what
    matters here; the runtime's 80/10/10 mix does not change the shapes)."""
    masked, positions, targets = [], [], []
    for doc in chunks:
        picked = sorted(rng.sample(range(len(doc)), max(1, round(MASK_RATE * len(doc)))))
        masked.append([np.full(len(s), MASK_ID) if i in picked else s for i, s in enumerate(doc)])
        positions.append(picked)
        targets.append([doc[i] for i in picked])
    return masked, positions, targets


def machine(device: str) -> dict:
    cpu = platform.processor()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = dict(cpu=cpu, cores=os.cpu_count(), torch_threads=torch.get_num_threads(), torch=torch.__version__,
                python=platform.python_version(), device_name="cpu")
    if device == "cuda":
        info.update(device_name=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    info.update(source_revision(), command=run_command())  # the commit, whether tracked files differed, argv
    return info


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(runner, step_fn, batches: dict[str, list[PretrainBatch]], warmup: int, device: str) -> dict:
    """Warm every layout up, then time their steps in turn (one step of each, again and again), so that
    a machine whose load changes during the run slows every layout alike."""
    for layout in batches.values():
        for batch in layout[:warmup]:
            step_fn(runner, batch)
    seconds = dict.fromkeys(batches, 0.0)
    peak = dict.fromkeys(batches, 0)
    n = len(next(iter(batches.values())))
    for i in range(warmup, n):
        for name, layout in batches.items():
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync(device)
            start = time.perf_counter()
            step_fn(runner, layout[i])
            sync(device)
            seconds[name] += time.perf_counter() - start
            if device == "cuda":
                peak[name] = max(peak[name], torch.cuda.max_memory_allocated())
    return {name: dict(seconds=seconds[name], steps=n - warmup,
                       peak_memory_gib=peak[name] / 2**30 if device == "cuda" else None) for name in batches}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--size", choices=["hibert_s", "hibert_m", "hibert_tiny"], default="hibert_s")
    p.add_argument("--docs", type=int, default=8, help="document chunks per batch")
    p.add_argument("--steps", type=int, default=3, help="timed steps per layout")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per layout (>= 2 with --compile)")
    p.add_argument("--layouts", default="packed,padded", help="comma list of packed,padded")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--checkpointing", action="store_true", help="per-layer activation checkpointing")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="peak dense TFLOP/s (H100 SXM bf16: 989)")
    p.add_argument("--data", type=Path, default=next((d for d in DEFAULT_DATA if d.is_file()), DEFAULT_DATA[-1]))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (1 is steadier on a machine shared with other jobs)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    layouts = args.layouts.split(",")

    torch.manual_seed(args.seed)
    cfg = load_config(None, [f"model={args.size}", f"model.activation_checkpointing={args.checkpointing}"]).model
    chunks = read_chunks(args.data, cfg.vocab_size, args.seed)
    rng = random.Random(args.seed)
    rng.shuffle(chunks)
    n_batches = args.warmup + args.steps
    if len(chunks) < n_batches * args.docs:  # small sample: reuse chunks, in a new order each pass
        chunks = [c for _ in range(-(-n_batches * args.docs // len(chunks))) for c in rng.sample(chunks, len(chunks))]
    raw = [mask_documents(chunks[i * args.docs:(i + 1) * args.docs], rng) for i in range(n_batches)]

    start = time.perf_counter()
    packed = [make_pretrain_batch(*r) for r in raw]
    collate_ms = (time.perf_counter() - start) / n_batches * 1e3
    padded = [make_padded_pretrain_batch(*r, MAX_SENTENCES, MAX_TOKENS) for r in raw]
    flops = [flops_per_batch(cfg, b.docs.sent_lens, b.docs.doc_lens, b.target_lens) for b in packed]
    real_tokens = [b.docs.num_real_tokens for b in packed]
    target_tokens = [b.num_target_tokens for b in packed]

    model = HibertForPretraining(cfg).to(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else None

    # Same function in both layouts: eval-mode losses on the first batch must agree (fp32, and with the
    # benchmark's autocast dtype, which takes the varlen kernels on CUDA).
    model.eval()
    with torch.no_grad():
        check = [model(b[0].to(args.device)).loss.item() for b in (packed, padded)]
        with torch.autocast(args.device, dtype=dtype, enabled=dtype is not None):
            check += [model(b[0].to(args.device)).loss.item() for b in (packed, padded)]
    model.train()

    runner = torch.compile(model) if args.compile else model

    def step(m, batch: PretrainBatch) -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=dtype, enabled=dtype is not None):
            out = m(batch)
        out.loss.backward()

    on_device = {name: [b.to(args.device) for b in (packed if name == "packed" else padded)] for name in layouts}
    results = time_steps(runner, step, on_device, args.warmup, args.device)
    timed = slice(args.warmup, None)
    for r in results.values():
        r["real_tokens_per_s"] = sum(real_tokens[timed]) / r["seconds"]
        r["target_tokens_per_s"] = sum(target_tokens[timed]) / r["seconds"]
        r["step_ms"] = r["seconds"] / r["steps"] * 1e3
        r["model_tflops_per_s"] = sum(flops[timed]) / r["seconds"] / 1e12
        r["mfu"] = r["model_tflops_per_s"] / args.peak_tflops if args.device == "cuda" else None
    del on_device

    slots = padded[0].docs.tokens.numel()
    summary = dict(
        args={k: str(v) for k, v in vars(args).items()}, machine=machine(args.device), model=cfg.model_dump(),
        parameters=count_parameters(cfg), collate_ms_per_batch=collate_ms,
        real_tokens_per_batch=float(np.mean(real_tokens)), target_tokens_per_batch=float(np.mean(target_tokens)),
        padded_token_slots_per_batch=slots, model_tflop_per_batch=float(np.mean(flops)) / 1e12,
        check_loss_fp32=dict(packed=check[0], padded=check[1]),
        check_loss_autocast=dict(packed=check[2], padded=check[3]), results=results,
    )
    if {"packed", "padded"} <= results.keys():
        summary["speedup_real_tokens_per_s"] = results["packed"]["real_tokens_per_s"] / results["padded"]["real_tokens_per_s"]

    print(f"{args.size} {args.dtype} on {summary['machine']['device_name']}: {args.docs} docs/batch, "
          f"{np.mean(real_tokens):.0f} real tokens vs {slots} padded slots, "
          f"{np.mean(target_tokens):.0f} target tokens; collate {collate_ms:.1f} ms/batch (CPU)")
    print(f"layout check, eval loss on batch 0: fp32 packed {check[0]:.6f} padded {check[1]:.6f}; "
          f"{args.dtype} packed {check[2]:.6f} padded {check[3]:.6f}")
    print(f"{'layout':8} {'step ms':>9} {'real tok/s':>11} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9}")
    for name, r in results.items():
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        mem = f"{r['peak_memory_gib']:.1f}" if r["peak_memory_gib"] is not None else "-"
        print(f"{name:8} {r['step_ms']:9.1f} {r['real_tokens_per_s']:11.0f} {r['model_tflops_per_s']:8.2f} "
              f"{mfu:>6} {mem:>9}")
    if "speedup_real_tokens_per_s" in summary:
        print(f"packed / padded real tokens/s: {summary['speedup_real_tokens_per_s']:.2f}x")
    out = args.out or REPO / "benchmarks/results" / f"bench_modeling_{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
