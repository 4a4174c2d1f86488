"""Corpus-scale `hibert summarize --output`: documents/s with 1 and 2 local processes on the shipped sample (1x)
and on 10x of it, and peak memory at 1x and 10x the input size (memory must stay flat in the corpus size: input is
streamed). The outputs of 1 and 2 processes must be byte-identical.

The corpus is every CNN/DM article shipped in samples/ (train + valid + test: 250 articles) as JSONL with ids;
10x is the same articles repeated ten times under new ids. Each configuration runs the real command in a fresh
process (model load and process start included, as a user sees it; the table also gives the rate without the
first window's start-up). Peak memory is the largest resident set of any process of the run (the parent and,
with --nproc, every shard process): ru_maxrss of the children of a wrapper process made for that run alone.

The model: --model (an export directory), else a tiny abstractive model trained here for a few steps on the
sample (random init; a scratch directory): only its size and decoding settings matter for speed.

    python benchmarks/bench_summarize.py                         # CPU: 1 vs 2 processes, 1x vs 10x memory
    python benchmarks/bench_summarize.py --model runs/demo/finetune-abs/export --beam 4
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from workload import machine, write_results  # noqa: E402

HIBERT = [sys.executable, "-m", "hibert.cli"]
SAMPLES = [REPO / "samples" / f"cnndm_{s}_sample.jsonl" for s in ("train", "val", "test")]
# 2 processes on 2 cores against 1 process using both cores (torch intra-op threads)
TARGETS = {"two_process_speedup_min": 1.3, "memory_10x_over_1x_max": 1.2}

# a wrapper that runs one command and reports the largest RSS of any process it waited for (KiB on Linux)
WRAP = ("import resource, subprocess, sys, time; t = time.time(); rc = subprocess.call(sys.argv[1:]); "
        "print('BENCH', rc, time.time() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return out


def tiny_model(scratch: Path) -> Path:
    """A 4-step abstractive model on the CNN/DM sample (random init), in `scratch`."""
    cnn = ("format: jsonl, text_field: article, summary_field: highlights, id_field: idx, "
           "summary_sentence_sep: ' . ', ptb_tokenized: true")
    data = scratch / "data"
    run([*HIBERT, "prep", "data.tokenizer.vocab_size=2000", f"data.output={data}", "data.valid_fraction=0",
         "data.test_fraction=0", f"data.sources=[{{{cnn}, path: '{SAMPLES[0]}', split: train}}, "
         f"{{{cnn}, path: '{SAMPLES[1]}', split: valid}}]"], timeout=1200)
    over = {"model": "hibert_tiny", "run.output_dir": scratch, "run.name": "abs", "data.dataset": data,
            "finetune.task": "abstractive", "decoder.layers": 2, "schedule.max_steps": 4, "schedule.eval_every": 0,
            "finetune.eval_decode_docs": 2, "tracking.register_model": False, "generation.max_length": 40,
            "generation.beam_size": 4, "deepspeed.zero_stage": 0, "schedule.batch_tokens": 3000}
    run([*HIBERT, "finetune", *[f"{k}={v}" for k, v in over.items()], "--init", "random"], timeout=1200)
    return scratch / "abs" / "export"


def corpus(path: Path, repeat: int) -> int:
    n = 0
    with open(path, "w") as out:
        for r in range(repeat):
            for src in SAMPLES:
                for line in src.read_text().splitlines():
                    rec = json.loads(line)
                    out.write(json.dumps({"id": f"{rec['idx']}-{r}", "text": rec["article"]}) + "\n")
                    n += 1
    return n


def measure(model: Path, corpus_path: Path, out: Path, nproc: int, extra: list[str]) -> dict:
    """One run of the real command; while it runs, the lines in its part files are counted every 50 ms, which
    gives the steady rate: documents/s between 10% and 100% of the corpus written (start-up excluded)."""
    cmd = [sys.executable, "-c", WRAP, *HIBERT, "summarize", "--model", model, "--input", corpus_path,
           "--output", out, "--nproc", nproc, "--no-progress", *extra]
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    total = sum(1 for _ in open(corpus_path))
    samples: list[tuple[float, int]] = []
    while proc.poll() is None:
        lines = 0
        for part in out.parent.glob(out.name + ".part-*"):
            if not part.name.endswith(".done"):
                with open(part, "rb") as f:
                    lines += f.read().count(b"\n")
        samples.append((time.time(), lines))
        time.sleep(0.05)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0 or "BENCH 0" not in stdout:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed:\n{stderr[-3000:]}")
    line = next(x for x in stdout.splitlines() if x.startswith("BENCH"))
    _, rc, seconds, rss_kib = line.split()
    stats = json.loads(out.with_name(out.name + ".stats.json").read_text())
    start = next(((t, n) for t, n in samples if n >= 0.1 * total), None)
    # the parts vanish at the merge: the end is the first sample that saw the most lines
    peak = max((n for _, n in samples), default=0)
    end = next(((t, n) for t, n in samples if n == peak), None)
    steady = (end[1] - start[1]) / (end[0] - start[0]) if start and end and end[0] > start[0] else None
    return {"nproc": nproc, "records": stats["records_in"], "summarized": stats["summarized"],
            "seconds": float(seconds), "docs_per_s": stats["summarized"] / float(seconds),
            "steady_docs_per_s": steady, "peak_rss_mb": int(rss_kib) / 1024}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="an export directory (default: a tiny model trained here)")
    p.add_argument("--beam", type=int, default=None, help="--beam for summarize (default: the model's)")
    p.add_argument("--repeat", type=int, default=10, help="the memory run's corpus is this many copies")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "bench_summarize_cpu.json")
    args = p.parse_args()
    extra = ["--beam", str(args.beam)] if args.beam else []
    with tempfile.TemporaryDirectory(prefix="bench-summarize-") as tmp:
        scratch = Path(tmp)
        model = args.model or tiny_model(scratch)
        one = scratch / "corpus_1x.jsonl"
        many = scratch / f"corpus_{args.repeat}x.jsonl"
        n1, nx = corpus(one, 1), corpus(many, args.repeat)
        big = f"{args.repeat}x"
        rows = {"1 process, 1x": measure(model, one, scratch / "o1.jsonl", 1, extra),
                "2 processes, 1x": measure(model, one, scratch / "o2.jsonl", 2, extra),
                f"1 process, {big}": measure(model, many, scratch / "o3.jsonl", 1, extra),
                f"2 processes, {big}": measure(model, many, scratch / "o4.jsonl", 2, extra)}
        same = ((scratch / "o1.jsonl").read_bytes() == (scratch / "o2.jsonl").read_bytes()
                and (scratch / "o3.jsonl").read_bytes() == (scratch / "o4.jsonl").read_bytes())
    # the speedup on the larger corpus: on the sample alone, process start and model load (a few seconds per
    # process) are a large part of the run
    speedup = rows[f"2 processes, {big}"]["docs_per_s"] / rows[f"1 process, {big}"]["docs_per_s"]
    steady = rows[f"2 processes, {big}"]["steady_docs_per_s"] / rows[f"1 process, {big}"]["steady_docs_per_s"]
    speedup_1x = rows["2 processes, 1x"]["docs_per_s"] / rows["1 process, 1x"]["docs_per_s"]
    mem_ratio = rows[f"1 process, {big}"]["peak_rss_mb"] / rows["1 process, 1x"]["peak_rss_mb"]
    print(f"{'run':<18} {'records':>8} {'seconds':>8} {'docs/s':>8} {'steady docs/s':>14} {'peak RSS MB':>12}")
    for name, r in rows.items():
        print(f"{name:<18} {r['records']:>8} {r['seconds']:>8.1f} {r['docs_per_s']:>8.1f} "
              f"{r['steady_docs_per_s'] or float('nan'):>14.1f} {r['peak_rss_mb']:>12.0f}")
    print(f"2 processes / 1 on {args.repeat}x: {speedup:.2f}x docs/s wall clock, {steady:.2f}x steady "
          f"(target >= {TARGETS['two_process_speedup_min']}; "
          f"on 1x, start-up included: {speedup_1x:.2f}x); "
          f"peak RSS {args.repeat}x / 1x: {mem_ratio:.2f} (target <= {TARGETS['memory_10x_over_1x_max']}); "
          f"2-process output byte-identical to 1-process: {same}")
    result = {"machine": machine(), "model": str(args.model or "tiny abstractive trained 4 steps (random init)"),
              "corpus_records_1x": n1, "corpus_records_many": nx, "runs": rows, "two_process_speedup": speedup,
              "two_process_speedup_1x": speedup_1x,
              "two_process_speedup_steady": steady,
              "memory_ratio": mem_ratio, "outputs_identical": same, "targets": TARGETS,
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    return write_results(args.out, result)


if __name__ == "__main__":
    sys.exit(main())
