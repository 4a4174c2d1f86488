"""Scaling on paper: 8-GPU and 4x8-GPU pretraining throughput for ZeRO-1/2/3 and the GIGA-CM epoch time,
from a MEASURED single-GPU step and the bytes a ZeRO step moves. Nothing here is measured on many GPUs.

Model of one optimizer step on N data-parallel GPUs, each with the measured micro-batch (x accumulation):
  compute    t_c = measured step time x accum (one GPU; forward 1/3, backward 2/3 of it)
  bytes      P parameters, b bytes per communicated element (bf16: 2);
             ZeRO-1/2: reduce-scatter of the gradients + all-gather of the updated parameters
                       = 2 collectives of P·b bytes;  ZeRO-3: + one more all-gather (forward and backward
                       each gather the parameters) = 3 collectives  (Rajbhandari et al. 2020, §7)
  time       a ring reduce-scatter / all-gather of S bytes takes S·(N-1)/N / busbw; busbw = NVLink within a
             node, the per-GPU network bandwidth across nodes (the slowest link of the ring)
  overlap    none:  t = t_c + t_comm          (pessimistic)
             ZeRO-2 (overlap_comm): the gradient reduce-scatter hides under the backward, the all-gather does
             not; ZeRO-3: the forward gather hides under the forward (prefetch), gather + reduce-scatter of the
             backward under the backward; ZeRO-1: nothing hides (gradients are reduced after the backward)
Throughput = N x tokens per GPU step / t.  The GIGA-CM epoch: 2,854M words (Zhang et al. 2019, §4.1) x
subwords per word x (1 + EOS per word), in encoder tokens (the unit bench_modeling counts).

    python benchmarks/project_scaling.py                          # from results/bench_modeling_cuda.json
    python benchmarks/project_scaling.py --measured results/bench_pretrain_cuda.json --ib-gbs 25
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from workload import GIGA_CM_WORDS, machine  # noqa: E402  (benchmarks/, the script's folder: the commit of the code that projected)


def measured_step(path: Path, size: str) -> dict:
    """Step time, encoder tokens per step and MFU of one GPU: a bench_pretrain (end to end) or a
    bench_modeling (model only) result."""
    r = json.loads(path.read_text())
    if "rows" in r:  # bench_pretrain: the end-to-end runtime; the best ZeRO row on one rank
        rows = [x for x in r["rows"] if x["ranks"] == 1 and x["size"] == size and x.get("device") == "cuda"]
        if not rows:
            raise SystemExit(f"{path}: no 1-rank CUDA row for {size}")
        x = max(rows, key=lambda x: x["tokens_per_s"])
        step_s = 1.0 / x["steps_per_s"]
        return {"source": f"{path.name} (end to end, ZeRO-{x['zero']})", "step_s": step_s,
                "tokens_per_step": x["tokens_per_s"] * step_s, "mfu": x.get("mfu"),
                "device": r["machine"].get("gpu", "?")}
    packed = r["results"]["packed"]
    return {"source": f"{path.name} (model only: no DeepSpeed, no loader)", "step_s": packed["step_ms"] / 1e3,
            "tokens_per_step": r["real_tokens_per_batch"], "mfu": packed["mfu"],
            "device": r["machine"].get("device_name", "?")}


def comm_seconds(params: int, elem_bytes: int, collectives: int, n: int, busbw_gbs: float) -> float:
    if n == 1:
        return 0.0
    return collectives * params * elem_bytes * (n - 1) / n / (busbw_gbs * 1e9)


def step_time(stage: int, t_c: float, t_coll: float, overlap: bool) -> float:
    """t_coll: the time of ONE collective over all parameters."""
    n_coll = 3 if stage == 3 else 2
    if not overlap or stage == 1:
        return t_c + n_coll * t_coll
    fwd, bwd = t_c / 3, 2 * t_c / 3
    if stage == 2:  # reduce-scatter under the backward, all-gather after the step
        return t_c + max(0.0, t_coll - bwd) + t_coll
    return t_c + max(0.0, t_coll - fwd) + max(0.0, 2 * t_coll - bwd)   # stage 3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--measured", default=None, help="a bench_pretrain_cuda.json or bench_modeling_cuda.json "
                   "(default: bench_pretrain_cuda.json if present, else bench_modeling_cuda.json)")
    p.add_argument("--size", default="hibert_m")
    p.add_argument("--nvlink-gbs", type=float, default=350.0, help="ring busbw within a node, GB/s (8x H100 "
                   "NVLink 4: ~450 peak per direction, NCCL reaches ~350-400)")
    p.add_argument("--ib-gbs", type=float, default=40.0, help="ring busbw across nodes per GPU, GB/s (one "
                   "400 Gb/s NDR port per GPU = 50 peak)")
    p.add_argument("--elem-bytes", type=int, default=2, help="bytes per communicated element (bf16 2, fp32 4)")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per GPU per optimizer step")
    p.add_argument("--target-mfu", type=float, default=0.45)
    p.add_argument("--subwords-per-word", type=float, default=1.20,
                   help="measured on the CNN/DM + BBC articles with an 8k unigram model: 2,252,392 / 1,877,771")
    p.add_argument("--eos-per-word", type=float, default=0.046, help="sentences per word (~22 words/sentence)")
    p.add_argument("--out", default=str(HERE / "results" / "projection_scaling.json"))
    args = p.parse_args()

    from hibert.config import load_config
    from hibert.modeling.accounting import count_parameters

    path = Path(args.measured) if args.measured else next(
        (q for q in (HERE / "results" / "bench_pretrain_cuda.json", HERE / "results" / "bench_modeling_cuda.json")
         if q.is_file()), None)
    if path is None or not path.is_file():
        raise SystemExit("no measured GPU step: run bench_pretrain.py or bench_modeling.py on a GPU first")
    m = measured_step(path, args.size)
    params = count_parameters(load_config(None, [f"model={args.size}"]).model.model_copy(
        update={"vocab_size": 32000}))["pretraining"]
    epoch_tokens = GIGA_CM_WORDS * args.subwords_per_word * (1 + args.eos_per_word)
    rows = []
    bases = [("measured", m["step_s"])]
    if m.get("mfu"):
        bases.append((f"at {args.target_mfu:.0%} MFU", m["step_s"] * m["mfu"] / args.target_mfu))
    for base, t1 in bases:
        t_c = t1 * args.accum
        tokens = m["tokens_per_step"] * args.accum
        for gpus, nodes in ((1, 1), (8, 1), (32, 4)):
            bw = args.nvlink_gbs if nodes == 1 else args.ib_gbs
            t_coll = comm_seconds(params, args.elem_bytes, 1, gpus, bw)
            for stage in (1, 2, 3):
                if gpus == 1 and stage > 1:
                    continue
                row = {"compute": base, "gpus": gpus, "nodes": nodes, "zero": stage if gpus > 1 else "-",
                       "comm_s": (3 if stage == 3 else 2) * t_coll}
                for overlap in (False, True):
                    t = step_time(stage, t_c, t_coll, overlap)
                    key = "overlap" if overlap else "no_overlap"
                    row[f"step_s_{key}"] = t
                    row[f"tokens_per_s_{key}"] = gpus * tokens / t
                    row[f"efficiency_{key}"] = t_c / t
                    row[f"giga_cm_epoch_h_{key}"] = epoch_tokens / (gpus * tokens / t) / 3600
                rows.append(row)

    print(f"measured: {m['source']} on {m['device']}: {m['step_s'] * 1e3:.1f} ms/step, "
          f"{m['tokens_per_step']:,.0f} encoder tokens/step/GPU" + (f", MFU {m['mfu']:.1%}" if m.get("mfu") else ""))
    print(f"{args.size}: {params / 1e6:.1f}M parameters, {args.elem_bytes}-byte elements; busbw {args.nvlink_gbs:g} GB/s "
          f"in a node, {args.ib_gbs:g} GB/s per GPU across nodes; accumulation {args.accum}; "
          f"GIGA-CM epoch = {epoch_tokens / 1e9:.2f}B encoder tokens")
    print(f"\n{'compute':<12} {'GPUs':>4} {'ZeRO':>4} {'comm ms':>8} | {'M tok/s':>8} {'eff':>5} {'epoch h':>7} "
          f"| overlapped: {'M tok/s':>8} {'eff':>5} {'epoch h':>7}")
    for r in rows:
        print(f"{r['compute']:<12} {r['gpus']:>4} {r['zero']!s:>4} {r['comm_s'] * 1e3:>8.1f} | "
              f"{r['tokens_per_s_no_overlap'] / 1e6:>8.2f} {r['efficiency_no_overlap']:>5.2f} "
              f"{r['giga_cm_epoch_h_no_overlap']:>7.2f} |             {r['tokens_per_s_overlap'] / 1e6:>8.2f} "
              f"{r['efficiency_overlap']:>5.2f} {r['giga_cm_epoch_h_overlap']:>7.2f}")
    out = Path(args.out)
    out.write_text(json.dumps({"machine": machine(), "measured": m, "parameters": params, "args": vars(args),
                               "giga_cm_epoch_tokens": epoch_tokens, "rows": rows}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
