"""How prep and the loader scale with the corpus: a generated Gigaword-layout corpus (make_corpus.py: real
Reuters and CNN/DM sentences resampled) at each --sizes, then

  * prep, 1 and 2 workers, each a fresh `hibert prep` process: words/s per core (kept input words over the
    run's wall time x workers), peak RSS of the largest process, the merge alone (`--merge`, timed again on the
    finished shards), shards, bytes on disk per token;
  * the loader, as the shard count grows (the smallest corpus prepared into --shard-counts shards): in a fresh
    process, time to open the training split (manifest + the cheap integrity check + the index), to plan an
    epoch, to read the first micro-batch's documents, to read the documents of a micro-batch in the middle of
    the epoch (what a resume does), and the process's RSS after that.

  * across nodes (--slurm-size, on the local two-node Slurm cluster of .ci/slurm_up.sh): `hibert submit` of the
    prep array (--slurm-shards tasks, one CPU each) and its merge, timed from submission to the merged
    manifest, then one local process preparing the same plan; the two datasets must be byte-identical (the
    sha256 of every file the manifest records, and the manifest less its timings).

Targets (the issue's): words/s/core at the largest size within 15% of the smallest; peak RSS at the largest
<= 1.2x the second largest; open and resume <= 1 s at the largest shard count; merge time linear in shards.
The tokenizer is trained once on the smallest corpus (timed apart) and reused. Results JSON with the machine.

    python benchmarks/bench_scale.py                                  # 10MB, 100MB; 10, 100, 1000 shards
    python benchmarks/bench_scale.py --sizes 10MB,100MB,1GB --shard-counts 10,1000,10000
    python benchmarks/bench_scale.py --sizes 100MB --skip prep,loader --slurm-size 100MB  # needs the cluster
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from make_corpus import parse_size, write  # noqa: E402
from workload import machine, write_results  # noqa: E402

HIBERT = [sys.executable, "-m", "hibert.cli"]
WRAP = ("import resource, subprocess, sys, time; t = time.time(); rc = subprocess.call(sys.argv[1:]); "
        "print('BENCH', rc, time.time() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
TARGETS = {"words_per_core_drop_max": 0.15, "rss_growth_max": 1.2, "open_and_resume_s_max": 1.0}

LOADER_PROBE = r"""
import json, sys, time
import numpy as np
t0 = time.perf_counter()
from hibert.data_prep import DocumentDataset
from hibert.runtime.batching import doc_costs, plan_epoch
from hibert.runtime.host_memory import host_peak_rss_kib   # the probe's own peak, not its forking parent's
imported = time.perf_counter()
ds = DocumentDataset(sys.argv[1], "train")
opened = time.perf_counter()
costs = doc_costs(ds.doc_num_tokens, ds.doc_num_sentences)
plan = plan_epoch(costs, seed=0, epoch=0, batch_tokens=8192, max_docs=64, world=1, accum=1)
planned = time.perf_counter()
def read(batch):
    return sum(int(sum(len(s) for s in ds[int(i)])) for i in batch)
first_tokens = read(plan.batches[0])
first = time.perf_counter()
middle_tokens = read(plan.batches[len(plan.batches) // 2])
middle = time.perf_counter()
rss_mb = host_peak_rss_kib() / 1024
# what an open dataset holds on the Python heap (and its peak while parsing the manifest): a second open, after
# the timings and the RSS are taken, since tracing slows the allocator; the per-process record of the split's
# shard files that the first open made is dropped first, so that the second makes (and counts) it again
import os, tracemalloc
sys.modules[DocumentDataset.__module__]._CHECKED.clear()
tracemalloc.start()
again = DocumentDataset(sys.argv[1], "train")
held, parse_peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(json.dumps({"chunks": len(ds), "batches": len(plan.batches), "open_s": opened - imported,
                  "plan_s": planned - opened, "first_batch_s": first - planned, "resume_batch_s": middle - first,
                  "open_to_resume_s": (opened - imported) + (planned - opened) + (middle - first),
                  "rss_mb": rss_mb, "manifest_mb": os.path.getsize(os.path.join(sys.argv[1], "manifest.json")) / 1e6,
                  "open_heap_mb": held / 1e6, "open_heap_peak_mb": parse_peak / 1e6}))
"""


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=REPO, **kw)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return out


def recipe(work: Path, corpus: Path, tokenizer: Path | None) -> Path:
    """A prep recipe for the generated corpus: Gigaword reader, the offline segmenter, no held-out splits."""
    path = work / f"{corpus.name}.yaml"
    tok = f"\n  tokenizer: {{vocab_size: 8000, model: '{tokenizer}'}}" if tokenizer else "\n  tokenizer: {vocab_size: 8000}"
    path.write_text(f"data:\n  sources:\n  - {{format: gigaword, path: '{corpus}/*.sgml.gz', name: syn, split: train}}"
                    f"\n  valid_fraction: 0.0\n  test_fraction: 0.0{tok}\n")
    return path


def wrapped(cmd: list) -> tuple[float, float]:
    """(wall seconds, peak RSS MB of the largest process) of one command in a fresh wrapper process."""
    out = run([sys.executable, "-c", WRAP, *cmd])
    _, rc, seconds, rss = next(x for x in out.stdout.splitlines() if x.startswith("BENCH")).split()
    return float(seconds), int(rss) / 1024


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def prep_run(rec: Path, out: Path, workers: int, shards: int | None, words: int) -> dict:
    """`words`: whitespace words of the input (the generator counts them); `shards` None: prep's own count
    (max(workers, input / data.shard_size_mb))."""
    count = [] if shards is None else ["--num-shards", shards]
    wall, rss = wrapped([*HIBERT, "prep", rec, f"data.output={out}", "--workers", workers, *count, "--no-progress"])
    t0 = time.time()
    run([*HIBERT, "prep", rec, f"data.output={out}", "--merge", *count, "--no-progress"])
    merge = time.time() - t0
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest["counts"]
    shard_dirs = list((out / "train").glob("shard-*"))
    return {"workers": workers, "shards": len(shard_dirs), "wall_s": wall, "peak_rss_mb": rss, "merge_s": merge,
            "docs_in": counts["docs_in"], "kept": counts["kept"], "words": words, "tokens": counts["tokens"],
            "words_per_s_per_core": words / wall / workers,
            "bytes_per_token": dir_bytes(out / "train") / max(1, counts["tokens"])}


def dataset_content(root: Path) -> dict:
    """What must be identical between two preparations of one plan: the manifest less when and how long, whose
    `files` hold the sha256 of every file a reader uses (each shard's arrays through its checksums.json)."""
    manifest = json.loads((root / "manifest.json").read_text())
    for key in ("created", "merge_seconds", "shard_seconds"):
        manifest.pop(key, None)
    return manifest


def job_records(job: str) -> list[dict[str, str]]:
    """`scontrol show job -o` as one dict per record (one per array task); [] once Slurm forgot the job."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        raise SystemExit(f"scontrol show job {job}: {out.stderr.strip()}")
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.stdout.splitlines() if line.strip()]


def slurm_prep(rec: Path, work: Path, size: str, shards: int, words: int) -> dict:
    """The prep array over the local cluster's nodes + its merge, against one local process."""
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        raise SystemExit("--slurm-size needs the local Slurm cluster: run .ci/slurm_up.sh (as root) first")
    out, jobs_dir = work / f"slurm-{size}", work / f"slurm-{size}-jobs"
    t0 = time.time()
    run([*HIBERT, "submit", rec, "--stages", "prep,prep-merge", "--out-dir", jobs_dir, f"data.output={out}",
         f"slurm.prep_shards={shards}", "slurm.cpus_per_task=1", "slurm.nodes=1", "slurm.time=02:00:00"])
    ids = json.loads((jobs_dir / "jobs.json").read_text())["jobs"]
    hosts: dict[str, str] = {}
    deadline = time.time() + 7200  # slurm.time of the jobs
    while True:
        if time.time() > deadline:
            raise SystemExit(f"the Slurm prep did not finish within 2 h; jobs {ids}, logs in {jobs_dir}")
        recs = {name: job_records(job) for name, job in ids.items()}
        hosts.update({r["JobId"]: r["BatchHost"] for r in recs["prep"] if r.get("BatchHost", "(null)") != "(null)"})
        states = [r.get("JobState") for rs in recs.values() for r in rs]
        if any(s in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                     "PREEMPTED") for s in states) or any(r.get("Reason") == "DependencyNeverSatisfied"
                                                          for rs in recs.values() for r in rs):
            raise SystemExit(f"a Slurm job of the prep failed: {states}; logs in {jobs_dir}")
        if all(s == "COMPLETED" for s in states) or not recs["prep-merge"]:
            break
        time.sleep(1)
    wall = time.time() - t0
    if not (out / "manifest.json").is_file():
        raise SystemExit(f"the merge wrote no manifest in {out}; logs in {jobs_dir}")
    local = work / f"local-{size}"
    local_wall, local_rss = wrapped([*HIBERT, "prep", rec, f"data.output={local}", "--workers", 1,
                                     "--num-shards", shards, "--no-progress"])
    identical = dataset_content(out) == dataset_content(local)
    row = {"size": size, "shards": shards, "nodes": sorted(set(hosts.values())), "wall_s": wall,
           "words_per_s": words / wall, "local_one_process_s": local_wall, "local_peak_rss_mb": local_rss,
           "speedup_over_one_process": local_wall / wall, "byte_identical": identical,
           "files_compared": len(dataset_content(out)["files"])}
    subprocess.run(["rm", "-rf", str(out), str(local)])
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10MB,100MB")
    p.add_argument("--shard-counts", default="10,100,1000")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--prep-shards", type=int, default=None,
                   help="shards of the prep runs (default: prep's own, one per data.shard_size_mb of input)")
    p.add_argument("--skip", default="", help="comma list of prep,loader to leave out")
    p.add_argument("--slurm-size", default=None,
                   help="one of --sizes: also prepare it as a Slurm array over the local cluster's nodes + merge")
    p.add_argument("--slurm-shards", type=int, default=2, help="array tasks (shards) of the --slurm-size run")
    p.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "bench_scale_cpu.json")
    args = p.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",")]
    if args.slurm_size and args.slurm_size not in sizes:
        p.error(f"--slurm-size {args.slurm_size} must be one of --sizes ({args.sizes})")
    workers = [int(w) for w in args.workers.split(",")]
    tmp = tempfile.TemporaryDirectory(prefix="bench-scale-") if args.work is None else None
    work = Path(tmp.name) if tmp else args.work
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": machine(), "sizes": {}, "loader": {}, "targets": TARGETS}

    corpora = {}
    for size in sizes:
        t0 = time.time()
        corpora[size] = work / f"corpus-{size}"
        meta = write(corpora[size], parse_size(size), "gigaword", 0, 64)
        print(f"[scale] corpus {size}: {meta['documents']} documents, {meta['words']:,} words "
              f"({time.time() - t0:.0f} s to generate)", flush=True)
        result["sizes"][size] = {"corpus": meta, "prep": []}
    t0 = time.time()
    tok_out = work / "tokenizer"
    run([*HIBERT, "prep", recipe(work, corpora[sizes[0]], None), f"data.output={tok_out}", "--tokenizer-only",
         "--no-progress"])
    tokenizer = tok_out / "tokenizer.model"
    result["tokenizer_s"] = time.time() - t0

    skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    for size in sizes if "prep" not in skip else []:
        rec = recipe(work, corpora[size], tokenizer)
        for w in workers:
            row = prep_run(rec, work / f"prep-{size}-{w}", w, args.prep_shards,
                           result["sizes"][size]["corpus"]["words"])
            result["sizes"][size]["prep"].append(row)
            print(f"[scale] prep {size} x{w}: {row['words_per_s_per_core']:,.0f} words/s/core, "
                  f"peak RSS {row['peak_rss_mb']:.0f} MB, merge {row['merge_s']:.1f} s", flush=True)
            subprocess.run(["rm", "-rf", str(work / f"prep-{size}-{w}")])

    if args.slurm_size:
        row = slurm_prep(recipe(work, corpora[args.slurm_size], tokenizer), work, args.slurm_size,
                         args.slurm_shards, result["sizes"][args.slurm_size]["corpus"]["words"])
        result["nodes"] = row
        print(f"[scale] {args.slurm_size} as a {row['shards']}-task Slurm array on {','.join(row['nodes'])} + merge: "
              f"{row['wall_s']:.0f} s from submission (one local process: {row['local_one_process_s']:.0f} s); "
              f"byte-identical: {row['byte_identical']} ({row['files_compared']} files)", flush=True)
        if not row["byte_identical"]:
            write_results(args.out, result)
            raise SystemExit("the Slurm array's dataset differs from the one-process dataset")

    # the loader's corpus: the smallest size in at least as many files as the largest shard count. A shard that
    # reads a part of a file reads the whole file (gzip does not seek), so one file in 10,000 parts would be
    # read 10,000 times; Gigaword itself comes in ~1,000 monthly files.
    counts = [int(x) for x in args.shard_counts.split(",")] if "loader" not in skip else []
    if counts:
        loader_corpus = work / f"corpus-{sizes[0]}-many-files"
        file_mb = parse_size(sizes[0]) / max(counts) / 2**20
        meta = write(loader_corpus, parse_size(sizes[0]), "gigaword", 0, file_mb)
        result["loader_corpus"] = meta
        print(f"[scale] loader corpus: {meta['files']} files, {meta['documents']} documents", flush=True)
        rec = recipe(work, loader_corpus, tokenizer)
    for n in counts:
        out = work / f"shards-{n}"
        row = prep_run(rec, out, max(workers), n, result["loader_corpus"]["words"])
        probe = json.loads(run([sys.executable, "-c", LOADER_PROBE, out]).stdout.strip().splitlines()[-1])
        result["loader"][str(n)] = {"prep": row, **probe}
        print(f"[scale] {n} shards: open {probe['open_s']:.3f} s, plan {probe['plan_s']:.3f} s, first batch "
              f"{probe['first_batch_s']:.3f} s, resume batch {probe['resume_batch_s']:.3f} s, merge "
              f"{row['merge_s']:.1f} s, RSS {probe['rss_mb']:.0f} MB", flush=True)
        subprocess.run(["rm", "-rf", str(out)])

    print("\nprep (generated Gigaword-layout corpus)")
    print(f"{'size':>6} {'workers':>7} {'words/s/core':>13} {'peak RSS MB':>12} {'merge s':>8} {'shards':>7} "
          f"{'bytes/token':>12}")
    for size, entry in result["sizes"].items():
        for r in entry["prep"]:
            print(f"{size:>6} {r['workers']:>7} {r['words_per_s_per_core']:>13,.0f} {r['peak_rss_mb']:>12.0f} "
                  f"{r['merge_s']:>8.1f} {r['shards']:>7} {r['bytes_per_token']:>12.2f}")
    print("\nloader vs shard count")
    print(f"{'shards':>7} {'chunks':>8} {'open s':>8} {'plan s':>8} {'first s':>8} {'resume s':>9} {'merge s':>8} "
          f"{'RSS MB':>7}")
    for n, r in result["loader"].items():
        print(f"{n:>7} {r['chunks']:>8} {r['open_s']:>8.3f} {r['plan_s']:>8.3f} {r['first_batch_s']:>8.3f} "
              f"{r['resume_batch_s']:>9.3f} {r['prep']['merge_s']:>8.1f} {r['rss_mb']:>7.0f}")
    if "nodes" in result:
        r = result["nodes"]
        print(f"\nacross nodes: {r['size']} in {r['shards']} shards on {','.join(r['nodes'])}: {r['wall_s']:.0f} s from "
              f"submission to the merged manifest, one local process {r['local_one_process_s']:.0f} s; "
              f"byte-identical {r['byte_identical']}")
    first, last = sizes[0], sizes[-1]
    w1 = lambda s: next(r for r in result["sizes"][s]["prep"] if r["workers"] == workers[0])  # noqa: E731
    if "prep" not in skip:
        result["words_per_core_ratio_largest_vs_smallest"] = (w1(last)["words_per_s_per_core"]
                                                             / w1(first)["words_per_s_per_core"])
    if len(sizes) > 1 and "prep" not in skip:
        result["rss_ratio_largest_vs_second"] = w1(last)["peak_rss_mb"] / w1(sizes[-2])["peak_rss_mb"]
    print(json.dumps({k: v for k, v in result.items() if k.endswith(("ratio_largest_vs_smallest",
                                                                      "ratio_largest_vs_second"))}))
    return write_results(args.out, result)


if __name__ == "__main__":
    sys.exit(main())
