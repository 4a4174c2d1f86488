"""The pretraining data path alone (no model): how many encoder tokens/s the loader delivers, against what
a GPU consumes.

What is timed is exactly what `hibert pretrain` runs between the shards and `engine(batch)`: the epoch plan
(token-budget micro-batches), `MaskedSentenceTask.make_item` in DataLoader workers (shard reads, the 80/10/10
sentence masking, padding-free packing, FLOP accounting), the worker → main-process transfer, and — where
CUDA exists — pinning and the host → device copy. Stages:

  make_item      one process, no DataLoader: the per-core rate of the collate itself
  per-document ref  the same batches built one sentence array at a time (mask_document + make_pretrain_batch):
                 the reference make_item is measured against, in the same run
  loader w=N     the real DataLoader with N workers (0 = in the main process), batches consumed as fast as
                 they come; `--pin` adds pin_memory (CUDA builds only)

The consumption rate it is compared with is a measured GPU rate: HIBERT_M bf16 packed training on one H100
(benchmarks/results/bench_modeling_cuda.json, encoder tokens/s, 26.7% MFU), also scaled to the 45% MFU target.
The target is loader ≥ 10× consumption; the table says how many worker cores per GPU that takes at the
measured per-core rate.

    python benchmarks/bench_loader.py                       # a prepared dataset if given, else CNN/DM lengths
    python benchmarks/bench_loader.py --dataset runs/absgain/data/news --workers 0 1 2
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from workload import LengthsDataset, cnndm_lengths, machine  # noqa: E402

GPU_RESULT = HERE / "results" / "bench_modeling_cuda.json"
TARGET_MFU = 0.45


def gpu_rate() -> dict:
    """Encoder tokens/s one H100 consumed in bench_modeling (HIBERT_M, bf16, packed), and at 45% MFU."""
    if not GPU_RESULT.is_file():
        return {}
    r = json.loads(GPU_RESULT.read_text())
    packed = r["results"]["packed"]
    return {"device": r["machine"].get("device_name"), "measured_mfu": packed["mfu"],
            "tokens_per_s": packed["real_tokens_per_s"],
            "tokens_per_s_at_target": packed["real_tokens_per_s"] * TARGET_MFU / packed["mfu"]}


def load_data(args: argparse.Namespace):
    if args.dataset:
        from hibert.data_prep.dataset import DocumentDataset

        return DocumentDataset(args.dataset, "train"), f"prepared dataset {args.dataset} (train)"
    return LengthsDataset(cnndm_lengths(limit=args.docs), vocab=32000), "CNN/DM lengths, random ids (in memory)"


def time_make_item(task, data, batches: list[np.ndarray]) -> dict:
    t0 = time.perf_counter()
    tokens = sum(task.make_item(data, b, 0).batch.docs.num_real_tokens for b in batches)
    dt = time.perf_counter() - t0
    return {"stage": "make_item", "batches": len(batches), "seconds": dt, "tokens_per_s": tokens / dt,
            "ms_per_batch": dt / len(batches) * 1e3}


def time_per_document(task, data, batches: list[np.ndarray]) -> dict:
    """The reference collate: mask_document on each document's sentence arrays, then make_pretrain_batch
    (the same batches as make_item, built one sentence array at a time)."""
    from hibert.modeling import make_pretrain_batch
    from hibert.pretrain.objective import mask_document, other_document_sentence

    t0 = time.perf_counter()
    tokens = 0
    for b in batches:
        masked = [mask_document(data[i], task.spec, task.seed, 0, i, other_document_sentence(data, i))
                  for i in b.tolist()]
        batch = make_pretrain_batch([m.sentences for m in masked], [m.positions for m in masked],
                                    [m.targets for m in masked])
        tokens += batch.docs.num_real_tokens
    dt = time.perf_counter() - t0
    return {"stage": "per-document ref", "batches": len(batches), "seconds": dt, "tokens_per_s": tokens / dt,
            "ms_per_batch": dt / len(batches) * 1e3}


def time_loader(task, data, batches: list[np.ndarray], workers: int, pin: bool, device: torch.device) -> dict:
    from hibert.runtime.loader import make_loader

    loader = make_loader(task, data, batches, 0, workers, **({"pin_memory": True} if pin else {}))
    it = iter(loader)
    first = next(it)            # worker start-up is paid once per epoch; time the steady state
    tokens, n = 0, 0
    t0 = time.perf_counter()
    for item in it:
        item.to(device)
        tokens += item.batch.docs.num_real_tokens
        n += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del first
    return {"stage": f"loader w={workers}{' pin' if pin else ''}", "workers": workers, "pin": pin, "batches": n,
            "seconds": dt, "tokens_per_s": tokens / dt, "ms_per_batch": dt / max(n, 1) * 1e3}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default=None, help="a prepared dataset dir (default: CNN/DM lengths in memory)")
    p.add_argument("--docs", type=int, default=3000, help="documents of the in-memory workload")
    p.add_argument("--batch-tokens", type=int, default=65536, help="micro-batch token budget (HIBERT_M on a GPU)")
    p.add_argument("--max-docs", type=int, default=128)
    p.add_argument("--batches", type=int, default=60, help="batches timed per stage")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--repeats", type=int, default=3, help="runs per stage; the best is reported")
    p.add_argument("--pin", action="store_true", help="also time pin_memory (needs a CUDA build)")
    p.add_argument("--out", default=str(HERE / "results" / "bench_loader_cpu.json"))
    args = p.parse_args()

    from hibert.config import load_config
    from hibert.runtime.batching import doc_costs, plan_epoch
    from hibert.pretrain.masked_sentence import MaskedSentenceTask

    torch.set_num_threads(1)
    data, what = load_data(args)
    cfg = load_config(None, ["model=hibert_m"])
    task = MaskedSentenceTask(cfg, 32000)
    plan = plan_epoch(doc_costs(data.doc_num_tokens, data.doc_num_sentences), seed=0, epoch=0,
                      batch_tokens=args.batch_tokens, max_docs=args.max_docs, world=1, accum=1)
    batches = (plan.batches * (-(-args.batches // len(plan.batches))))[: args.batches]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"data: {what}; {len(plan.batches)} micro-batches of <= {args.batch_tokens} tokens in the epoch; "
          f"timing {len(batches)}; device for the copy: {device}")

    time_make_item(task, data, batches[:3])  # warm the shard pages and numpy

    def best(fn, *a) -> dict:  # best of --repeats: these machines are shared and noisy
        runs = [fn(*a) for _ in range(args.repeats)]
        r = max(runs, key=lambda r: r["tokens_per_s"])
        r["repeats_tokens_per_s"] = [x["tokens_per_s"] for x in runs]
        return r

    rows = [best(time_make_item, task, data, batches), best(time_per_document, task, data, batches)]
    rows[1]["make_item_speedup"] = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    for w in args.workers:
        rows.append(best(time_loader, task, data, batches, w, False, device))
        if args.pin and torch.cuda.is_available():
            rows.append(best(time_loader, task, data, batches, w, True, device))

    gpu = gpu_rate()
    per_core = rows[0]["tokens_per_s"]
    # one worker process: make_item plus the hand-over (pickling, shared memory), the rate workers add up to
    per_worker = next((r["tokens_per_s"] for r in rows if r.get("workers") == 1), per_core)
    print(f"\n{'stage':<16} {'ms/batch':>9} {'M tokens/s':>11} {'x GPU now':>10} {'x GPU@45%':>10}")
    for r in rows:
        if gpu:
            r["x_gpu_measured"] = r["tokens_per_s"] / gpu["tokens_per_s"]
            r["x_gpu_target"] = r["tokens_per_s"] / gpu["tokens_per_s_at_target"]
        print(f"{r['stage']:<16} {r['ms_per_batch']:>9.1f} {r['tokens_per_s'] / 1e6:>11.2f} "
              f"{r.get('x_gpu_measured', float('nan')):>10.1f} {r.get('x_gpu_target', float('nan')):>10.1f}")
    print(f"\nmake_item over the per-document reference: {rows[1]['make_item_speedup']:.2f}x")
    summary = {}
    if gpu:
        need = 10 * gpu["tokens_per_s_at_target"]
        summary = {"gpu": gpu, "per_core_tokens_per_s": per_core, "per_worker_tokens_per_s": per_worker,
                   "workers_for_10x_at_target": need / per_worker,
                   "workers_for_10x_measured": 10 * gpu["tokens_per_s"] / per_worker}
        print(f"\nGPU consumption ({gpu['device']}, HIBERT_M bf16): {gpu['tokens_per_s'] / 1e6:.2f} M tokens/s measured "
              f"({gpu['measured_mfu']:.1%} MFU), {gpu['tokens_per_s_at_target'] / 1e6:.2f} M at {TARGET_MFU:.0%} MFU")
        print(f"10x that at 45% MFU needs {summary['workers_for_10x_at_target']:.1f} loader workers (cores) per "
              f"GPU at {per_worker / 1e6:.2f} M tokens/s per worker ({per_core / 1e6:.2f} M for make_item alone)")
    out = Path(args.out)
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "args": vars(args), "data": what, "rows": rows, **summary},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
