"""Corpus-scale `hibert summarize --output` (its input: finetune/inference/source.py): a large JSONL file or a local Hugging Face dataset summarized in a
stream, split over processes (`--nproc`) or Slurm array tasks (`--shard I/N`), resumable, one ordered output.

- **Streaming.** Input is read a record at a time (JSONL line by line; a `save_to_disk` dataset by index from its
  memory-mapped Arrow files) and summarized in windows of `window` records — the decoder batches a window by
  length — so memory does not grow with the corpus.
- **Shards.** Record i (its position in the input) belongs to shard i mod N. Shard k appends to
  `<output>.part-k-of-N`, a window at a time, each window in input order and fsynced; a record that cannot be
  summarized (bad JSON, no text, too long, ...) is written as a `skipped` line with its reason, so every input
  record has exactly one output line and nothing is lost silently. A finished shard writes `<part>.done`. A
  shard holds an exclusive lock on its part while it writes it: a second process for the same part is refused.
- **Resume.** A shard restarted after an interruption reads the last complete line of its part (a line cut by
  the crash is dropped), checks that the input still has that id at that position, and continues after it:
  nothing is redone beyond the window in flight, nothing is written twice. Parts made with another shard count
  are refused (the count to use is named), and so are parts made with another model or decoding settings
  (`<output>.settings.json`, written when the first part is started).
- **Merge.** Once every shard is done, the parts are merged by position into `<output>` (written to a temporary
  file, then renamed), with `<output>.stats.json` saying how many records came in, were summarized and were
  skipped, and why. The parts are removed after a merge. `.done`, `stats.json` and `settings.json` are written
  to a temporary file, fsynced and renamed; one that cannot be read is ignored and its work redone.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import heapq
import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hibert.durable import write_atomic
from hibert.errors import UserError
from hibert.finetune.inference.source import Record, Shard, Source
from hibert.finetune.inference.text import Summary
from hibert.open_files import raise_soft_limit


def part_path(output: Path, shard: Shard) -> Path:
    return output.with_name(f"{output.name}.part-{shard.index:05d}-of-{shard.count:05d}")


def done_path(part: Path) -> Path:
    return part.with_name(part.name + ".done")


def stats_path(output: Path) -> Path:
    return output.with_name(output.name + ".stats.json")


def settings_path(output: Path) -> Path:
    return output.with_name(output.name + ".settings.json")


_PART = re.compile(r"\.part-(\d{5})-of-(\d{5})$")


def read_json(path: Path, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """A metadata file (`.done`, `stats.json`, `settings.json`) with these keys; None if it is missing or cannot
    be read (cut by a crash of an older version): its work is then redone."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and all(k in d for k in keys) else None


_DONE_KEYS = ("written", "summarized", "skipped", "resumed_after")


def read_done(part: Path) -> dict[str, Any] | None:
    """The shard's closing counts; None while it is unfinished, or when its part file is gone (the shard is redone)."""
    return read_json(done_path(part), _DONE_KEYS) if part.is_file() else None


def read_stats(output: Path) -> dict[str, Any] | None:
    return read_json(stats_path(output), ("records_in", "summarized", "skipped"))


def part_counts(output: Path) -> set[int]:
    """The shard counts of the part files (and `.done` files) next to `output`."""
    counts = set()
    if output.parent.is_dir():
        for p in output.parent.glob(f"{glob_escape(output.name)}.part-*"):
            m = _PART.search(p.name.removesuffix(".done"))
            if m:
                counts.add(int(m.group(2)))
    return counts


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def check_shard_count(output: Path, count: int) -> None:
    """Refuse to start (or merge) `count` shards where parts of another count are: resuming with another
    --nproc would redo their work and leave them behind."""
    other = sorted(part_counts(output) - {count})
    if other:
        m = other[0]
        raise UserError(f"{output}: part files of a run split into {m} shards are there "
                        f"({part_path(output, Shard(0, m)).name}, ...): resume it with --nproc {m} (a Slurm array: "
                        f"--shard I/{m}, --merge --shards {m}), or remove them to start over")


def settings_fingerprint(model_digest: str, model_ref: str, field: str | None, split: str | None,
                         settings: dict[str, Any]) -> dict[str, Any]:
    """What decides the summaries of a corpus run: the model, the input field and split, its settings
    (`model_settings`: the head's resolved inference settings). Not a batch size, which sets speed and memory: a
    run that ran out of memory resumes with a smaller one."""
    own = settings.get("model_settings")
    if isinstance(own, dict):
        settings = {**settings, "model_settings": {k: v for k, v in own.items() if k != "batch_size"}}
    return {"model": model_digest, "model_ref": model_ref, "field": field, "split": split, "settings": settings}


def check_settings(output: Path, fingerprint: dict[str, Any] | None) -> None:
    """Record what the parts are made with (model, decoding settings) when the first one starts; refuse a resume
    with anything else, which would mix two models' summaries in one output."""
    if fingerprint is None:
        return
    fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True))   # compared as read back (lists, not tuples)
    path = settings_path(output)
    had = read_json(path, ("model",))
    if had is not None and _has_work(output):
        shown = _differences(had, fingerprint)
        if shown:
            raise UserError(f"{output}: its part files were made with other settings ({shown}): rerun with the same "
                            f"model and flags to resume, or remove the part files and {path.name} to start over")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(fingerprint, indent=1, sort_keys=True))


def _differences(had: dict[str, Any], now: dict[str, Any]) -> str:
    """What differs between two settings fingerprints, for the user ("" when nothing does)."""
    diff = [k for k in sorted(set(had) | set(now)) if k != "model_ref" and had.get(k) != now.get(k)]
    return "; ".join("the model: " + _show(had.get("model_ref")) + " then" if k == "model" else
                     f"{k}: {_show(had.get(k))} then, {_show(now.get(k))} now" for k in diff)


def _has_work(output: Path) -> bool:
    """Whether any part next to `output` holds a line (an empty one is only a start)."""
    return any(p.stat().st_size > 0 for p in output.parent.glob(f"{glob_escape(output.name)}.part-*")
               if _PART.search(p.name) and p.is_file())


def _show(v: Any) -> str:
    return json.dumps(v, sort_keys=True)[:200]


def lock_part(part: Path):
    """The part opened for appending, under an exclusive lock held until it is closed: two processes writing
    one part would duplicate its lines (a second run started while the first one's processes still run)."""
    part.parent.mkdir(parents=True, exist_ok=True)
    out = open(part, "ab")
    try:
        fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        out.close()
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise UserError(f"{part}: another process is writing it (a run of this command still going?): wait "
                            "for it to end, or stop it, then rerun to resume") from None
        raise
    return out


def check_unlocked(output: Path, count: int) -> None:
    """Refuse before starting `count` shard processes if any of their parts is being written by another one."""
    for i in range(count):
        part = part_path(output, Shard(i, count))
        if part.is_file():
            lock_part(part).close()


def _part_line(line: bytes, part: Path) -> dict[str, Any]:
    """One line of a part file: an object with an integer `index`; anything else was not written here."""
    try:
        rec = json.loads(line)
        if not isinstance(rec, dict) or not isinstance(rec.get("index"), int):
            raise ValueError("no integer 'index'")
    except (ValueError, RecursionError) as e:
        raise UserError(f"{part}: holds a line this command did not write ({type(e).__name__}: {str(e)[:200]}); "
                        "remove the part files to start over") from None
    return rec


def last_written(part: Path) -> tuple[int, str | None]:
    """(position, id) of the part's last complete line, (-1, None) for none; a line cut by a crash (no final
    newline) is cut off the file."""
    if not part.is_file():
        return -1, None
    with open(part, "rb+") as f:
        size = end = f.seek(0, os.SEEK_END)
        tail = b""
        while end > 0 and tail.count(b"\n") < 2:   # read backwards until the last complete line is in `tail`
            start = max(0, end - (1 << 16))
            f.seek(start)
            tail = f.read(end - start) + tail
            end = start
        cut = tail.rfind(b"\n")
        keep = end + cut + 1 if cut >= 0 else 0
        if keep < size:
            f.truncate(keep)
        if cut < 0:
            return -1, None
        last = _part_line(tail[:cut].rsplit(b"\n", 1)[-1], part)
        return last["index"], last.get("id")


@dataclass
class ShardResult:
    written: int = 0
    summarized: int = 0
    skipped: Counter = field(default_factory=Counter)
    resumed_after: int = -1


def _done_result(d: dict[str, Any]) -> ShardResult:
    return ShardResult(d["written"], d["summarized"], Counter(d["skipped"]), d["resumed_after"])


def summarize_shard(summarize_all: Callable[[list], list[Summary]], source: Source, output: Path, shard: Shard,
                    window: int = 64, on_window: Callable[[int], None] | None = None,
                    fingerprint: dict[str, Any] | None = None) -> ShardResult:
    """This shard's records into its part file, a window at a time; resumes after the part's last line.
    `fingerprint`: the model and settings the part is made with (a resume with others is refused)."""
    part = part_path(output, shard)
    check_shard_count(output, shard.count)
    if not part.is_file():
        done_path(part).unlink(missing_ok=True)   # a .done whose part was removed: the shard is redone
    if (d := read_done(part)) is not None:
        return _done_result(d)
    with lock_part(part) as out:
        if (d := read_done(part)) is not None:   # finished while this process waited to start
            return _done_result(d)
        check_settings(output, fingerprint)
        result = _summarize_into(out, part, summarize_all, source, shard, window, on_window)
        done = {"written": result.written, "summarized": result.summarized, "skipped": dict(result.skipped),
                "resumed_after": result.resumed_after}
        write_atomic(done_path(part), json.dumps(done))   # before the lock goes: a waiting run sees it done
    return result


def _summarize_into(out, part: Path, summarize_all: Callable[[list], list[Summary]], source: Source, shard: Shard,
                    window: int, on_window: Callable[[int], None] | None) -> ShardResult:
    result = ShardResult()
    after, last_id = last_written(part)
    result.resumed_after = after
    if after >= 0:   # what the part already holds counts toward this shard's totals
        with open(part, "rb") as f:
            for line in f:
                rec = _part_line(line, part)
                result.written += 1
                if "skipped" in rec:
                    result.skipped[rec.get("reason", "skipped")] += 1
                else:
                    result.summarized += 1
        if on_window and result.written:
            on_window(result.written)   # the progress bar starts where the part left off
    # from the last written record on: it is read again to check that the input still has it there
    records = source.records(shard, after - 1 if after >= 0 else -1)
    if after >= 0:   # the record at the resume point must still be the one the part holds
        first = next(records, None)
        if first is None or first.position != after or first.doc_id != last_id:
            raise UserError(f"{part}: its last line is {last_id!r} at input position {after}, but the input now has "
                            f"{None if first is None else first.doc_id!r} there: the input changed since this "
                            "output was started; remove the part files or write to another --output")
    batch: list[Record] = []

    def flush() -> None:
        good = [r for r in batch if r.skipped is None]
        summaries = iter(summarize_all([(r.doc_id, r.body) for r in good]) if good else [])
        lines = []
        for r in batch:
            if r.skipped is None:
                lines.append({"index": r.position, **next(summaries).record(source.clusters)})
                result.summarized += 1
            else:
                kind, _, why = r.skipped.partition(": ")
                lines.append({"index": r.position, "id": r.doc_id, "skipped": why or kind, "reason": kind})
                result.skipped[kind] += 1
        out.write("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode("utf-8"))
        out.flush()
        os.fsync(out.fileno())
        result.written += len(lines)
        if on_window:
            on_window(len(lines))
        batch.clear()

    for rec in records:
        batch.append(rec)
        if len(batch) >= window:
            flush()
    if batch:
        flush()
    return result


def check_output(output: Path, input_path: Path) -> None:
    """Refuse an --output that would overwrite the input, or that cannot be written as a file, before any work."""
    if output.is_dir():
        raise UserError(f"--output {output}: a directory; name a file in it (e.g. {output / 'summaries.jsonl'})")
    same = output.resolve() == input_path.resolve()
    if not same and output.exists() and input_path.exists():
        same = os.path.samefile(output, input_path)
    if same:
        raise UserError(f"--output {output} is the --input: write the summaries to another file")


def merge(output: Path, count: int, source_name: str = "", input_digest: str | None = None) -> dict[str, Any]:
    """The `count` finished parts merged by input position into `output`; returns (and writes) the stats, with
    what the parts were made with (settings.json) and the input's digest, so that a finished output asked for
    again with anything else is not taken for done (`check_complete`)."""
    if output.is_dir():
        raise UserError(f"--output {output}: a directory; name a file in it")
    parts = [part_path(output, Shard(i, count)) for i in range(count)]
    dones = [read_done(p) for p in parts]
    missing = [p.name for p, d in zip(parts, dones) if d is None]
    if missing:
        check_shard_count(output, count)   # parts of another count: say which count they were made with
        raise UserError(f"{output}: {len(missing)} of {count} shards are not finished ({', '.join(missing[:3])}"
                        f"{', ...' if len(missing) > 3 else ''}): run them (or rerun the command) before merging")
    tmp = output.with_name(output.name + ".tmp")
    summarized, skipped, n = 0, Counter(), 0
    _allow_open_files(count + 64)
    files = [open(p, "rb") for p in parts]
    try:
        def keyed(f, part: Path):  # noqa: ANN202
            for line in f:
                yield _part_line(line, part)["index"], line
        with open(tmp, "wb") as out:
            for _, line in heapq.merge(*(keyed(f, p) for f, p in zip(files, parts)), key=lambda t: t[0]):
                out.write(line)
                n += 1
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        for f in files:
            f.close()
    for d in dones:
        summarized += d["summarized"]
        skipped.update(d["skipped"])
    stats = {"input": source_name, "records_in": n, "summarized": summarized, "skipped": dict(skipped),
             "shards": count, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
             "settings": read_json(settings_path(output), ("model",)), "input_digest": input_digest}
    if summarized + sum(skipped.values()) != n:
        tmp.unlink()
        raise UserError(f"{output}: the parts hold {n} lines but their shards counted {summarized} summarized + "
                        f"{sum(skipped.values())} skipped; remove the part files and run again")
    tmp.replace(output)
    write_atomic(stats_path(output), json.dumps(stats, indent=1))
    for p in parts:
        p.unlink()
        done_path(p).unlink()
    settings_path(output).unlink(missing_ok=True)
    return stats


def _allow_open_files(n: int) -> None:
    """The merge holds every part open at once: raise the soft limit toward the hard one where it is lower."""
    _, hard = raise_soft_limit(n)
    if hard < n:
        raise UserError(f"merging {n - 64} parts needs {n} open files, above this process's hard limit {int(hard)} "
                        "(ulimit -Hn): use fewer shards")


def stats_line(stats: dict[str, Any], output: Path) -> str:
    skipped = sum(stats["skipped"].values())
    why = ", ".join(f"{k} {v}" for k, v in sorted(stats["skipped"].items()))
    return (f"{stats['records_in']} records in: {stats['summarized']} summarized + {skipped} skipped"
            f"{f' ({why})' if why else ''} -> {output} (in input order; stats: {stats_path(output)})")


def export_digest(path: Path) -> str:
    """A digest of a file or of a directory's files (names, sizes, and the first and last MiB of each): a model
    export or an input corpus; two that differ anywhere but the middle of a file of the same size get different
    digests, cheaply."""
    h = hashlib.sha256()
    files = [(Path(path), Path(path).name)] if Path(path).is_file() else \
        [(p, p.relative_to(path).as_posix()) for p in sorted(Path(path).rglob("*"))]
    for p, rel in files:
        if not p.is_file() or any(part.startswith(".") or part == "__pycache__" for part in Path(rel).parts):
            continue
        size = p.stat().st_size
        h.update(f"{rel}\0{size}\0".encode())
        with open(p, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 1 << 20:
                f.seek(max(1 << 20, size - (1 << 20)))
                h.update(f.read())
    return h.hexdigest()[:16]


def check_complete(stats: dict[str, Any], fingerprint: dict[str, Any], input_digest: str, output: Path) -> None:
    """A finished output asked for again: the same model, settings and input say "already complete"; anything
    else is refused (it would hide new work behind an old result). Stats written before these were recorded
    are taken as complete."""
    had = stats.get("settings")
    if had is None:
        return
    shown = [d for d in [_differences(had, json.loads(json.dumps(fingerprint, sort_keys=True)))] if d]
    if stats.get("input_digest") not in (None, input_digest):
        shown.append("the input: its content changed")
    if shown:
        raise UserError(f"{output} is complete, made with other settings or input ({'; '.join(shown)}): name "
                        "another --output, or remove it and its .stats.json to summarize again")
