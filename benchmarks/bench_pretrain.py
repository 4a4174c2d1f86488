"""Pretraining throughput through the real runtime (DeepSpeed engine, loader, trainer).

CPU: HIBERT_S, 1 vs 2 ranks, ZeRO 0/1/2/3: steps/s, real tokens/s, per-rank bytes of parameters +
optimizer state. GPU: HIBERT_M bf16 ZeRO-1/2: tokens/s, MFU, data-wait fraction. Every run logs the step
breakdown (tracking.step_breakdown: data wait / forward / backward / optimizer ms per step, device synchronized
at each phase) and the workers' collate ms per micro-batch.

    python benchmarks/bench_pretrain.py                     # CPU matrix (spawns the ranks itself)
    python benchmarks/bench_pretrain.py --device cuda --size hibert_m --stages 1 2 --ranks 1 \
        --batch-tokens 65536 --loader-workers 4 --steps 30 --warmup 10
Each configuration runs in fresh processes; results -> benchmarks/results/bench_pretrain_<device>.json

Reading the memory column (bytes per storage, P parameters, fp32): ZeRO-0 is plain torch AdamW, 3P·4 bytes
(weights, m, v). DeepSpeed's ZeRO optimizers (stages 1-3) also keep an fp32 master copy, 4P·4 on one rank;
with N ranks stage 1/2 hold P + 3P/N, stage 3 holds 4P/N — half of its 1-rank footprint at N = 2, and
2/3 of ZeRO-0's. With bf16 weights the master copy is needed anyway and stage 3 at N = 2 halves it all.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def worker(args: argparse.Namespace) -> None:
    """One configuration, inside a launched rank."""
    import logging

    import torch.distributed as dist

    from hibert.config import load_config
    from hibert.runtime.engine import init_distributed
    from hibert.pretrain.masked_sentence import MaskedSentenceTask
    from hibert.runtime.memory import rank_state_bytes
    from hibert.runtime.trainer import Trainer
    from workload import LengthsDataset, cnndm_lengths

    out_root = tempfile.mkdtemp(prefix="bench-pretrain-")
    cfg = load_config(None, [f"model={args.size}", f"deepspeed.zero_stage={args.zero}",
                             f"deepspeed.precision={args.precision}", f"run.output_dir={out_root}",
                             f"run.name=z{args.zero}", f"schedule.max_steps={args.warmup + args.steps}",
                             f"schedule.batch_tokens={args.batch_tokens}", f"schedule.log_every={args.warmup}",
                             "schedule.eval_every=0", "schedule.warmup_steps=100", "checkpoint.every_steps=0",
                             "checkpoint.keep_best=0", "checkpoint.resume=never", "tracking.register_model=false",
                             f"data.num_workers_loader={args.loader_workers}", "schedule.epochs=100",
                             "tracking.step_breakdown=true"]
                      + ([f"tracking.peak_tflops={args.peak_tflops}"] if args.peak_tflops else []))
    rt = init_distributed(cfg)
    logging.basicConfig(level=logging.WARNING)
    if args.dataset:  # a prepared dataset through the real shards
        from hibert.data_prep.dataset import DocumentDataset

        data = DocumentDataset(args.dataset, "train")
    else:
        data = LengthsDataset(cnndm_lengths(limit=args.docs), vocab=32000)
    task = MaskedSentenceTask(cfg, 32000)
    trainer = Trainer(cfg, task, rt, data, None)

    # log_every = warmup: the window logged at step `warmup` covers the warmup, and with
    # steps a multiple of warmup the last logged window is steady state.
    trainer.fit()
    m = dict(trainer.last_metrics)
    mem = rank_state_bytes(trainer.engine)
    if rt.rank == 0:
        row = {"size": args.size, "zero": args.zero, "ranks": rt.world_size, "precision": rt.precision,
               "device": rt.device.type, "steps": args.steps, **m, **mem}
        Path(args.result).write_text(json.dumps(row))
    if dist.is_initialized():
        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--size", default="hibert_s")
    p.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--precision", default="auto")
    p.add_argument("--steps", type=int, default=9, help="timed steps (a multiple of --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--docs", type=int, default=600)
    p.add_argument("--loader-workers", type=int, default=1)
    p.add_argument("--dataset", default=None, help="a prepared dataset dir (default: CNN/DM lengths in memory)")
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--zero", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    from hibert.runtime.launch import launch_local
    from workload import machine

    rows = []
    for ranks in args.ranks:
        for z in args.stages:
            res = tempfile.mktemp(suffix=".json")
            argv = [__file__, "--worker", "--zero", str(z), "--result", res, "--size", args.size,
                    "--precision", args.precision, "--steps", str(args.steps), "--warmup", str(args.warmup),
                    "--batch-tokens", str(args.batch_tokens), "--docs", str(args.docs),
                    "--loader-workers", str(args.loader_workers)] + (
                    ["--dataset", args.dataset] if args.dataset else []) + (
                    ["--peak-tflops", str(args.peak_tflops)] if args.peak_tflops else [])
            t = time.time()
            code = launch_local(ranks, argv)
            if code != 0 or not Path(res).is_file():
                print(f"ranks={ranks} zero={z}: failed (exit {code})")
                continue
            row = json.loads(Path(res).read_text())
            row["wall_s"] = time.time() - t
            rows.append(row)
            print(f"ranks={ranks} zero={z} tokens/s={row.get('tokens_per_s', 0):.0f} "
                  f"state MiB/rank={row['total_bytes'] / 2**20:.1f} mfu={row.get('mfu', float('nan')):.3f}", flush=True)
    if not rows:
        sys.exit(1)
    base = {r["ranks"]: r for r in rows if r["zero"] == 0} or {}
    print(f"\n{'ranks':>5} {'zero':>4} {'prec':>5} {'tokens/s':>10} {'steps/s':>8} {'state MiB':>10} "
          f"{'vs ZeRO-0':>9} {'MFU':>6} {'wait':>6} | ms/step: {'data':>6} {'fwd':>7} {'bwd':>7} {'opt':>7} "
          f"{'collate':>7}")
    for r in rows:
        ref = base.get(r["ranks"])
        ratio = r["total_bytes"] / ref["total_bytes"] if ref else float("nan")
        print(f"{r['ranks']:>5} {r['zero']:>4} {r['precision']:>5} {r.get('tokens_per_s', 0):>10.0f} "
              f"{r.get('steps_per_s', float('nan')):>8.2f} {r['total_bytes'] / 2**20:>10.1f} {ratio:>9.2f} "
              f"{r.get('mfu', float('nan')):>6.3f} {r.get('data_wait_fraction', float('nan')):>6.3f} | ms/step: "
              + " ".join(f"{r.get(k, float('nan')):>{w}.1f}" for k, w in
                         (("data_ms", 6), ("forward_ms", 7), ("backward_ms", 7), ("optimizer_ms", 7),
                          ("collate_ms", 7))))
    out = HERE / "results" / f"bench_pretrain_{args.device}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "args": vars(args), "rows": rows}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
