"""`hibert summarize --output`: a whole corpus into one ordered JSONL file (the streaming, sharding, resume and
merge are finetune/inference/corpus.py). This module runs one shard in this process, or starts `--nproc` local
processes (one shard each, one GPU each where there are GPUs) and shows one progress bar for all of them, then
merges. A Slurm array runs one shard per task (`--shard "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT"`) and a
last job merges (`--merge --shards N`): `hibert submit` plans both (slurm/stages.py)."""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from hibert.config import Config
from hibert.errors import UserError, disk_full, free_mb, not_writable, writable_dir
from hibert.finetune.inference.corpus import (
    check_complete,
    check_output,
    check_settings,
    check_shard_count,
    check_unlocked,
    done_path,
    export_digest,
    merge,
    part_path,
    read_stats,
    settings_fingerprint,
    stats_line,
    stats_path,
    summarize_shard,
)
from hibert.finetune.inference.flags import SettingError, resolve_settings
from hibert.finetune.inference.fluency import fluency_note
from hibert.finetune.inference.source import Shard, Source
from hibert.finetune.inference.text import max_doc_chars
from hibert.finetune.settings import SummarizeSettings, default_device, model_ref
from hibert.heads import head_of_export
from hibert.registry import resolve_model, tracking_uri

CHILD_ENV = "HIBERT_SUMMARIZE_CHILD"   # set in the processes --nproc starts: no bar of their own, no merge
DEFAULT_WINDOW = 64                    # records per window when neither --window nor a larger --batch-size says


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
    # a stop signal is one line saying what is kept (a shard process of --nproc: its parent says it)
    previous = {} if os.environ.get(CHILD_ENV) == "1" else {s: signal.signal(s, _raise_stopped) for s in _STOP_SIGNALS}
    try:
        check_output(output, Path(args.input[0]))
        done = None
        if output.is_file() and stats_path(output).is_file():
            done = read_stats(output)
            if done is None:
                print(f"hibert summarize: note: {stats_path(output)} cannot be read: summarizing (or merging) again",
                      file=sys.stderr)
            elif done.get("settings") is None:   # made before outputs recorded their settings: taken as complete
                print(f"already complete: {stats_line(done, output)}")
                return 0
        if done is None:   # what will be written: its directory, before the model loads
            writable_dir(output.parent, "--output's directory")
        return _run(cfg, args, settings, output, done)
    except UserError as e:
        return _fail(str(e))
    except _Stopped as e:
        return _fail(_stopped_line(e.signum, output), 128 + e.signum)
    except (OSError, RuntimeError) as e:   # the output's own path, not the run directory hibert's handler names
        if disk_full(e):
            return _fail(f"no space left on device writing --output {output} ({free_mb(output.parent)}): what was "
                         "written is kept: free space and rerun the same command to resume", 1)
        if not_writable(e) and getattr(e, "filename", None):
            return _fail(f"{e.filename} is not writable ({e.strerror})")
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _raise_stopped(signum: int, _frame: object) -> None:
    raise _Stopped(signum)


def _stopped_line(signum: int, output: Path) -> str:
    """What a stopped run keeps: the summaries its part files hold (complete lines), and how to go on."""
    if output.is_file() and stats_path(output).is_file():
        return f"stopped by {signal.Signals(signum).name} after {output} was complete"
    parts = [p for p in output.parent.glob(f"{glob.escape(output.name)}.part-*-of-*") if p.suffix != ".done"]
    kept = 0
    for p in parts:
        try:
            kept += p.read_bytes().count(b"\n")
        except OSError:
            pass
    where = f" in {parts[0]}" if len(parts) == 1 else f" in {len(parts)} part files next to {output}" if parts else ""
    return (f"stopped by {signal.Signals(signum).name}: {kept} summaries written so far are kept{where}; rerun the "
            "same command to resume")


def _run(cfg: Config, args: argparse.Namespace, settings: SummarizeSettings, output: Path,
         done: dict | None) -> int:
    """`done`: the stats of a finished `output` (None: not finished)."""
    shard = Shard.parse(args.shard) if args.shard else Shard(0, 1)
    if args.merge:   # joins the parts: the input only names itself in the stats
        if done is not None:
            print(f"already complete: {stats_line(done, output)}")
            return 0
        if not args.shards:
            return _fail("--merge needs --shards N (how many shards the corpus was split into)")
        try:
            name = Source(Path(args.input[0]), args.field, args.id_field, args.split).name
        except UserError:
            name = Path(args.input[0]).name
        stats = merge(output, args.shards, name, export_digest(Path(args.input[0])))
        print(stats_line(stats, output))
        return 0
    # the input is checked before the model resolves: its problems are not the model's
    source = Source(Path(args.input[0]), args.field, args.id_field, args.split)
    local_procs = args.nproc > 1 and not args.shard
    check_shard_count(output, args.nproc if local_procs else shard.count)
    if local_procs:
        check_unlocked(output, args.nproc)
    source.check()
    ref = model_ref(cfg, args.model)
    try:
        # the user's model cache (array tasks resolving at once: each downloads beside it, the first rename wins)
        local = resolve_model(ref, tracking_uri(cfg.tracking.uri, cfg.run.output_dir, create=False))
        head = head_of_export(local)
        source.clusters, source.max_chars = head.reads == "clusters", max_doc_chars(local)
        if head.summarizer is None:
            return _fail(f"cannot load model {ref!r}: a {head.name} model does not summarize")
    except (FileNotFoundError, ValueError) as e:
        return _fail(f"cannot load model {args.model or ref!r}: {e}")
    try:  # the flags over the model's own settings, once: what every part is made with
        resolved = resolve_settings(head, local, settings.flags)
    except SettingError as e:
        return _fail(str(e))
    except (FileNotFoundError, ValueError) as e:
        return _fail(f"cannot load model {args.model or ref!r}: {e}")
    # what the parts are made with: a resume with another model or other settings would mix two kinds of summary
    fingerprint = settings_fingerprint(export_digest(local), args.model or ref, args.field, source.split,
                                       {"model_settings": resolved.model_dump() if resolved is not None else None,
                                        "ranking": settings.ranking})
    if done is not None:   # finished: with the same model, settings and input only
        check_complete(done, fingerprint, export_digest(source.path), output)
        print(f"already complete: {stats_line(done, output)}")
        return 0
    child = os.environ.get(CHILD_ENV) == "1"
    total = source.count(shard) if not args.no_progress and not child else None
    if local_procs:
        check_settings(output, fingerprint)
        return _run_local(args.nproc, local, source, output, total)
    try:
        summarizer = head.summarizer(cfg, local, default_device(), resolved, settings)
    except (FileNotFoundError, ValueError) as e:
        return _fail(f"cannot load model {args.model or ref!r}: {e}")
    note = fluency_note(local) if head.decodes and not child else None
    if note:
        print(f"hibert summarize: note: {note}", file=sys.stderr)
    bar = None
    if total is not None:
        bar = tqdm(total=total, unit="doc", desc=f"summarize {source.name}", file=sys.stderr, dynamic_ncols=True)
    try:
        # a window holds at least one decoding batch (--batch-size 256 on a GPU is read 256 records at a time)
        window = args.window or max(DEFAULT_WINDOW, getattr(resolved, "batch_size", 0))
        result = summarize_shard(summarizer.summarize_all, source, output, shard, window,
                                 on_window=bar.update if bar else None, fingerprint=fingerprint)
    finally:
        if bar is not None:
            bar.close()
    if result.resumed_after >= 0 and not child:
        print(f"hibert summarize: resumed after input position {result.resumed_after} "
              f"({part_path(output, shard).name})", file=sys.stderr)
    if shard.count == 1:
        print(stats_line(merge(output, 1, source.name, export_digest(source.path)), output))
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
        import torch  # lazy: ~1 s, only where no CUDA_VISIBLE_DEVICES names the GPUs

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


class _Stopped(Exception):
    """A stop signal reached the --nproc parent: its shard processes are stopped too."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)   # kill, timeout(1), a closed terminal, Slurm


def _die_with_parent() -> Callable[[], None] | None:
    """For a shard process: SIGTERM when the parent dies, even by SIGKILL (Linux), so that no orphan keeps
    writing its part. libc is loaded here, in the parent: the child only calls it, between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    return lambda: libc.prctl(1, signal.SIGTERM)   # 1: PR_SET_PDEATHSIG


def _run_local(n: int, local: Path, source: Source, output: Path, total: int | None) -> int:
    """n processes, one shard each; one progress bar (lines appended to the parts); merge when all are done.
    A stop signal (SIGTERM, SIGHUP, SIGUSR1, Ctrl-C) is passed on to the shard processes and waited for: what
    they wrote is kept and a rerun resumes it."""
    stopping: list[int] = []   # the signal that stops the run; [.., 0]: the processes are being stopped anyway

    def on_signal(signum: int, _frame) -> None:  # noqa: ANN001
        if not stopping:   # a signal while the processes are being stopped changes nothing
            stopping.append(signum)
            raise _Stopped(signum)

    previous = {s: signal.signal(s, on_signal) for s in _STOP_SIGNALS}
    try:
        code = _run_processes(n, local, source, output, total, stopping)
    except _Stopped as e:   # before any process started
        return _fail(f"stopped by {signal.Signals(e.signum).name}", 128 + e.signum)
    finally:   # the merge below stops as any command does
        for s, handler in previous.items():
            signal.signal(s, handler)
    if code is not None:
        return code
    try:
        stats = merge(output, n, source.name, export_digest(source.path))
    except UserError as e:
        return _fail(str(e), 1)
    print(stats_line(stats, output))
    return 0


def _run_processes(n: int, local: Path, source: Source, output: Path, total: int | None,
                   stopping: list[int]) -> int | None:
    """The exit code of a run that failed or was stopped; None when every shard finished."""
    threads = max(1, (os.cpu_count() or 1) // n)
    pre_exec = _die_with_parent()
    procs: list[subprocess.Popen] = []
    bar = None
    seen = [0] * n
    offsets = [0] * n
    failed: list[int] = []
    try:
        for i, device in enumerate(_devices(n)):
            env = {**os.environ, CHILD_ENV: "1", "OMP_NUM_THREADS": str(threads)}
            if device is not None:
                env["CUDA_VISIBLE_DEVICES"] = device
            procs.append(subprocess.Popen(_child_argv(n, i, local), env=env, preexec_fn=pre_exec))
        if total is not None:
                bar = tqdm(total=total, unit="doc", desc=f"summarize {source.name} ({n} processes)",
                       file=sys.stderr, dynamic_ncols=True)
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
    except (KeyboardInterrupt, _Stopped) as e:
        failed = list(range(n))
        if isinstance(e, KeyboardInterrupt):
            stopping.append(signal.SIGINT)
    finally:
        if not stopping:
            stopping.append(0)   # from here on a stop signal only ends what is stopped below anyway
        if bar is not None:
            bar.close()
        if failed or stopping[0]:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    if stopping[0]:
        return _fail(f"stopped by {signal.Signals(stopping[0]).name}: the shard processes were stopped; what was "
                     "written is kept: rerun the same command to resume", 128 + stopping[0])
    if failed:
        done = sum(done_path(part_path(output, Shard(i, n))).is_file() for i in range(n))
        return _fail(f"shard process(es) {failed} failed ({done} of {n} shards finished); what was written is kept: "
                     "rerun the same command to resume", 1)
    return None
