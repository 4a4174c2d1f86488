"""`hibert summarize --output`: a whole corpus into one ordered JSONL file (the streaming, sharding, resume and
merge are finetune/base/corpus.py). This module runs one shard in this process, or starts `--nproc` local
processes (one shard each, one GPU each where there are GPUs) and shows one progress bar for all of them, then
merges. A Slurm array runs one shard per task (`--shard "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT"`) and a
last job merges (`--merge --shards N`): `hibert submit` plans both (slurm/stages.py)."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hibert.config import Config
from hibert.errors import UserError
from hibert.finetune.base.corpus import (
    Shard,
    Source,
    done_path,
    merge,
    part_path,
    stats_line,
    stats_path,
    summarize_shard,
)
from hibert.finetune.base.settings import SummarizeSettings, default_device, model_ref

CHILD_ENV = "HIBERT_SUMMARIZE_CHILD"   # set in the processes --nproc starts: no bar of their own, no merge


def _fail(message: str, code: int = 2) -> int:
    print(f"hibert summarize: {message}", file=sys.stderr)
    return code


def run_summarize_corpus(cfg: Config, args: argparse.Namespace, settings: SummarizeSettings) -> int:
    output = Path(args.output)
    if args.input and len(args.input) > 1:
        return _fail("--output reads one --input (a .jsonl file or a saved datasets directory)")
    if not args.input:
        return _fail("--output needs --input (a .jsonl file or a saved datasets directory)")
    if args.limit:
        return _fail("--limit does not apply to --output (a corpus is summarized whole; cut the input instead)")
    if output.is_file() and stats_path(output).is_file():
        import json

        print(f"already complete: {stats_line(json.loads(stats_path(output).read_text()), output)}")
        return 0
    try:
        return _run(cfg, args, settings, output)
    except UserError as e:
        return _fail(str(e))
    except (ValueError, KeyError) as e:  # a damaged part file (a line that is not one of ours)
        return _fail(f"{output}: a part file holds a line this command did not write ({type(e).__name__}: "
                     f"{str(e)[:200]}); remove the part files to start over", 1)


def _run(cfg: Config, args: argparse.Namespace, settings: SummarizeSettings, output: Path) -> int:
    from hibert.finetune.abstractive.export import generation_for_export
    from hibert.finetune.base.fluency import fluency_note
    from hibert.finetune.base.generation import DecodingFlagError
    from hibert.finetune.base.text import max_doc_chars
    from hibert.finetune.heads import head_of_export
    from hibert.registry import resolve_model, tracking_uri

    shard = Shard.parse(args.shard) if args.shard else Shard(0, 1)
    if args.merge:
        if not args.shards:
            return _fail("--merge needs --shards N (how many shards the corpus was split into)")
        stats = merge(output, args.shards, Path(args.input[0]).name)
        print(stats_line(stats, output))
        return 0
    ref = model_ref(cfg, args.model)
    try:
        # array tasks of one job resolve the model at the same time: each into its own directory
        dst = cfg.run_dir / ("summarize-model" if shard.count == 1 else f"summarize-model-shard{shard.index}")
        local = resolve_model(ref, tracking_uri(cfg.tracking.uri, cfg.run.output_dir, create=False), dst)
        head = head_of_export(local)
        source = Source(Path(args.input[0]), args.field, args.id_field, args.split, head.reads == "clusters",
                        max_doc_chars(local))
        total = source.count(shard) if not args.no_progress and os.environ.get(CHILD_ENV) != "1" else None
        if args.nproc > 1 and not args.shard:
            return _run_local(args.nproc, local, source, output, total)
        generation = generation_for_export(local, settings) if head.decodes else None
        if head.summarizer is None:
            return _fail(f"cannot load model {ref!r}: a {head.name} model does not summarize")
        summarizer = head.summarizer(cfg, local, default_device(), generation, settings)
    except DecodingFlagError as e:
        return _fail(str(e))
    except (FileNotFoundError, ValueError) as e:
        return _fail(f"cannot load model {args.model or ref!r}: {e}")
    child = os.environ.get(CHILD_ENV) == "1"
    note = fluency_note(local) if head.decodes and not child else None
    if note:
        print(f"hibert summarize: note: {note}", file=sys.stderr)
    bar = None
    if total is not None:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="doc", desc=f"summarize {source.name}", file=sys.stderr, dynamic_ncols=True)
    try:
        result = summarize_shard(summarizer.summarize_all, source, output, shard, args.window,
                                 on_window=bar.update if bar else None)
    finally:
        if bar is not None:
            bar.close()
    if result.resumed_after >= 0 and not child:
        print(f"hibert summarize: resumed after input position {result.resumed_after} "
              f"({part_path(output, shard).name})", file=sys.stderr)
    if shard.count == 1:
        print(stats_line(merge(output, 1, source.name), output))
    elif not child:
        print(f"shard {shard.index}/{shard.count}: {result.written} records written to "
              f"{part_path(output, shard)}; when all {shard.count} are done: hibert summarize ... --output {output} "
              f"--merge --shards {shard.count}")
    return 0


def _devices(n: int) -> list[str | None]:
    """The GPU each of n children sees: the parent's own CUDA_VISIBLE_DEVICES entries (or all the GPUs there
    are), round-robin; None each where there is no GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [x.strip() for x in visible.split(",") if x.strip() and x.strip() != "-1"]
    else:
        import torch

        ids = [str(i) for i in range(torch.cuda.device_count())]
    return [ids[i % len(ids)] if ids else None for i in range(n)]


def _child_argv(n: int, i: int, local: Path) -> list[str]:
    """This command for shard i of n: --nproc dropped, the model already resolved to a local directory (the
    children must not race to download it)."""
    argv, skip = [], False
    for word in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if word == "--nproc":
            skip = True
            continue
        if word.startswith("--nproc="):
            continue
        argv.append(word)
    return [sys.executable, "-m", "hibert.cli", *argv, "--model", str(local), "--shard", f"{i}/{n}"]


def _run_local(n: int, local: Path, source: Source, output: Path, total: int | None) -> int:
    """n processes, one shard each; one progress bar (lines appended to the parts); merge when all are done."""
    threads = max(1, (os.cpu_count() or 1) // n)
    procs = []
    for i, device in enumerate(_devices(n)):
        env = {**os.environ, CHILD_ENV: "1", "OMP_NUM_THREADS": str(threads)}
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        procs.append(subprocess.Popen(_child_argv(n, i, local), env=env))
    bar = None
    if total is not None:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="doc", desc=f"summarize {source.name} ({n} processes)",
                   file=sys.stderr, dynamic_ncols=True)
    seen = [0] * n
    offsets = [0] * n
    failed: list[int] = []
    try:
        while True:
            for i in range(n):   # lines appended to each part since the last look
                part = part_path(output, Shard(i, n))
                if part.is_file():
                    if part.stat().st_size < offsets[i]:   # a resumed child cut a partial line: count again
                        offsets[i] = seen[i] = 0
                    with open(part, "rb") as f:
                        f.seek(offsets[i])
                        chunk = f.read()
                    offsets[i] += len(chunk)
                    seen[i] += chunk.count(b"\n")
            if bar is not None:
                bar.update(sum(seen) - bar.n)
            codes = [p.poll() for p in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        failed = list(range(n))
    finally:
        if bar is not None:
            bar.close()
        if failed:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
    if failed:
        done = sum(done_path(part_path(output, Shard(i, n))).is_file() for i in range(n))
        return _fail(f"shard process(es) {failed} failed ({done} of {n} shards finished); what was written is kept: "
                     "rerun the same command to resume", 1)
    try:
        stats = merge(output, n, source.name)
    except UserError as e:
        return _fail(str(e), 1)
    print(stats_line(stats, output))
    return 0
