"""How long the cnndm-40k recipe would take on one GPU, projected from what 2 CPU cores measured.

Each pretraining stage's model FLOPs per real token are counted on its own prepared data (the masked-sentence
task's batches, `modeling/accounting.py`: the FLOPs the runtime's MFU counts); times its measured tokens/s this is
the FLOP/s the CPUs reached. On a GPU those FLOPs are seconds of work, even at a 5% MFU (a 192-wide, 2-layer model
cannot keep tensor cores busy), so the optimizer steps bound the stage instead: each costs at most what one step
of HIBERT_M (6 layers, 768 wide, 62k tokens: more kernels and far more work than this model's 16k-token step)
took on an H100 in `bench_modeling_cuda.json`, the one GPU training measurement on record. The projection is the
larger of the two bounds; the device suite measures the real figure when a GPU is lent.
Not a test: prints a table and writes JSON with the machine description.

    python benchmarks/project_cnndm40k_gpu.py [--record docs/results/cnndm40k-pretrain-open-in-p1.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np

from hibert.config import load_config
from hibert.data_prep import DocumentDataset
from hibert.pretrain.masked_sentence import MaskedSentenceTask
from hibert.runtime.peak_flops import peak_tflops

REPO = Path(__file__).resolve().parent.parent
# the stage's data config and prepared folder (configs/recipes/cnndm-40k.yaml's pipeline)
STAGES = {"pretrain-open": ("open40k", "runs/c40-data/open"),
          "pretrain-in": ("cnndm40k_pretrain", "runs/c40-data/cnndm_pretrain")}
FLOOR_MFU = 0.05


def flops_per_token(data_config: str, dataset_dir: Path, docs: int, seed: int) -> dict[str, float]:
    """Model FLOPs (forward + backward) per real token over `docs` random training chunks, in batches of 32."""
    cfg = load_config("cnndm-40k", [f"data={data_config}", f"data.output={dataset_dir}"])
    data = DocumentDataset(dataset_dir, "train")
    vocab = json.loads((dataset_dir / "tokenizer.json").read_text())["describe"]["vocab_size"]
    task = MaskedSentenceTask(cfg, vocab)
    picks = np.random.default_rng(seed).choice(len(data), size=min(docs, len(data)), replace=False)
    flops = tokens = 0.0
    for batch in np.array_split(picks, max(1, len(picks) // 32)):
        item = task.make_item(data, np.sort(batch), epoch=0)
        flops, tokens = flops + item.flops, tokens + item.real_tokens
    return {"flops_per_token": flops / tokens, "chunks_sampled": int(len(picks))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--record", type=Path, default=REPO / "docs/results/cnndm40k-pretrain-open-in-p1.json")
    ap.add_argument("--gpu-bench", type=Path, default=REPO / "benchmarks/results/bench_modeling_cuda.json")
    ap.add_argument("--docs", type=int, default=2048, help="training chunks sampled per stage")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/project_cnndm40k_gpu.json")
    args = ap.parse_args()
    record = json.loads(args.record.read_text())
    bench = json.loads(args.gpu_bench.read_text())
    gpu_name = bench["machine"]["device_name"]
    peak = peak_tflops(gpu_name)["tflops"]
    step_ms = bench["results"]["packed"]["step_ms"]
    rows = []
    for stage, (data_config, folder) in STAGES.items():
        st = record["stages"][stage]
        fpt = flops_per_token(data_config, REPO / folder, args.docs, seed=0)
        cpu_flops_s = st["tokens_per_s_median"] * fpt["flops_per_token"]
        tokens = st["tokens_per_s_median"] * st["minutes"] * 60   # what the stage trained, at its median rate
        row = {"stage": stage, "steps": st["steps"], "cpu_minutes": st["minutes"],
               "cpu_tokens_per_s": st["tokens_per_s_median"], **fpt, "cpu_gflops_per_s": cpu_flops_s / 1e9,
               "total_pflop": tokens * fpt["flops_per_token"] / 1e15}
        row["gpu_minutes_flops_at_floor_mfu"] = st["minutes"] * cpu_flops_s / (FLOOR_MFU * peak * 1e12)
        row["gpu_minutes_steps"] = st["steps"] * step_ms / 1e3 / 60
        row["gpu_minutes_projected"] = max(row["gpu_minutes_flops_at_floor_mfu"], row["gpu_minutes_steps"])
        rows.append(row)
    out = {"benchmark": "project_cnndm40k_gpu", "record": str(args.record.relative_to(REPO)),
           "gpu": {"name": gpu_name, "peak_tflops": peak, "hibert_m_step_ms": step_ms,
                   "source": str(args.gpu_bench.relative_to(REPO)), "floor_mfu": FLOOR_MFU},
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "python": platform.python_version()},
           "stages": rows}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'stage':<15}{'steps':>7}{'CPU min':>9}{'tok/s':>9}{'MFLOP/tok':>11}{'CPU GFLOP/s':>13}{'PFLOP':>8}"
          f"{'GPU min: FLOPs at 5%':>22}{'steps':>8}{'projected':>11}")
    for r in rows:
        print(f"{r['stage']:<15}{r['steps']:>7}{r['cpu_minutes']:>9.1f}{r['cpu_tokens_per_s']:>9,}"
              f"{r['flops_per_token'] / 1e6:>11.2f}{r['cpu_gflops_per_s']:>13.1f}{r['total_pflop']:>8.3f}"
              f"{r['gpu_minutes_flops_at_floor_mfu']:>22.2f}{r['gpu_minutes_steps']:>8.2f}{r['gpu_minutes_projected']:>11.2f}")
    print(f"GPU: {gpu_name}, {peak} TFLOP/s bf16 dense; a step at most HIBERT_M's {step_ms:.1f} ms there; "
          f"wrote {args.out.relative_to(REPO)}")

if __name__ == "__main__":
    main()
