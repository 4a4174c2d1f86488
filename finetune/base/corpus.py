"""Corpus-scale `hibert summarize --output`: a large JSONL file or a local Hugging Face dataset summarized in a
stream, split over processes (`--nproc`) or Slurm array tasks (`--shard I/N`), resumable, one ordered output.

- **Streaming.** Input is read a record at a time (JSONL line by line; a `save_to_disk` dataset by index from its
  memory-mapped Arrow files) and summarized in windows of `window` records — the decoder batches a window by
  length — so memory does not grow with the corpus.
- **Shards.** Record i (its position in the input) belongs to shard i mod N. Shard k appends to
  `<output>.part-k-of-N`, a window at a time, each window in input order and fsynced; a record that cannot be
  summarized (bad JSON, no text, too long, ...) is written as a `skipped` line with its reason, so every input
  record has exactly one output line and nothing is lost silently. A finished shard writes `<part>.done`.
- **Resume.** A shard restarted after an interruption reads the last complete line of its part (a line cut by
  the crash is dropped), checks that the input still has that id at that position, and continues after it:
  nothing is redone beyond the window in flight, nothing is written twice.
- **Merge.** Once every shard is done, the parts are merged by position into `<output>` (written to a temporary
  file, then renamed), with `<output>.stats.json` saying how many records came in, were summarized and were
  skipped, and why. The parts are removed after a merge.
"""
from __future__ import annotations

import heapq
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hibert.errors import UserError
from hibert.finetune.base.text import InputError, Summary, check_length, is_json_lines


@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """'I/N' with 0 <= I < N (a Slurm array task: --shard "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT")."""
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise UserError(f"--shard {text!r}: expected I/N, e.g. 0/4") from None
        if n < 1 or not 0 <= i < n:
            raise UserError(f"--shard {text}: needs 0 <= I < N")
        return cls(i, n)

    def owns(self, position: int) -> bool:
        return position % self.count == self.index


@dataclass
class Record:
    position: int                        # 0-based position in the input (JSONL: line number - 1)
    doc_id: str
    body: Any = None                     # text, or a list of texts for a cluster
    skipped: str | None = None           # why it cannot be summarized (kind: message)


@dataclass
class Source:
    """Where records come from: a JSONL file or a `datasets.save_to_disk` directory (`split` of a DatasetDict)."""
    path: Path
    field: str = "text"
    id_field: str | None = None
    split: str | None = None
    clusters: bool = False
    max_chars: int = 1_000_000
    name: str = ""

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if self.path.is_dir():
            if not any((self.path / f).is_file() for f in ("dataset_info.json", "dataset_dict.json", "state.json")):
                raise UserError(f"--input {self.path}: a directory, but not a dataset saved with "
                                "datasets' save_to_disk (no dataset_info.json / dataset_dict.json)")
        elif not self.path.is_file():
            raise UserError(f"--input {self.path}: no such file or dataset directory")
        elif not is_json_lines(self.path.name):
            raise UserError(f"--input {self.path}: corpus mode (--output) reads JSON Lines (.jsonl) or a saved "
                            "datasets directory")
        self.name = self.path.name if self.path.is_file() else f"{self.path.name}[{self.split or 'train'}]"

    @property
    def key(self) -> str:
        return ("documents" if self.field == "text" else self.field) if self.clusters else self.field

    # ------------------------------------------------------------------------------------------ reading
    def _dataset(self):
        from datasets import DatasetDict, load_from_disk

        ds = load_from_disk(str(self.path))
        if isinstance(ds, DatasetDict):
            split = self.split or ("test" if "test" in ds else next(iter(ds)))
            if split not in ds:
                raise UserError(f"--input {self.path}: no split {split!r} (splits: {', '.join(ds)})")
            self.name = f"{self.path.name}[{split}]"
            ds = ds[split]
        return ds

    def count(self, shard: "Shard | None" = None) -> int:
        """Records in the input (JSONL: non-blank lines) that `shard` owns (all: None), for the progress bar."""
        shard = shard or Shard()
        if self.path.is_dir():
            return len(range(shard.index, len(self._dataset()), shard.count))
        with open(self.path, "rb") as f:
            return sum(1 for pos, line in enumerate(f) if shard.owns(pos) and line.strip())

    def records(self, shard: Shard, after: int = -1) -> Iterator[Record]:
        """The shard's records past position `after`, in input order; bad ones as skipped records."""
        if self.path.is_dir():
            ds = self._dataset()
            start = shard.index if after < 0 else after + 1 + (shard.index - after - 1) % shard.count
            for i in range(start, len(ds), shard.count):
                yield self._record(i, ds[i], f"{self.name}:{i + 1}")
            return
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                pos = lineno - 1
                if pos <= after or not shard.owns(pos) or not raw.strip():
                    continue
                where = f"{self.name}:{lineno}"
                try:
                    rec = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    yield Record(pos, where, skipped=f"not UTF-8: {where}: {e.reason} at byte {e.start}")
                    continue
                except json.JSONDecodeError as e:
                    yield Record(pos, where, skipped=f"invalid JSON: {where}: {e.msg}")
                    continue
                yield self._record(pos, rec, where)

    def _record(self, pos: int, rec: Any, where: str) -> Record:
        if not isinstance(rec, dict):
            return Record(pos, where, skipped=f"not an object: {where}: a JSON {type(rec).__name__}")
        if self.id_field:
            if rec.get(self.id_field) is None:
                return Record(pos, where, skipped=f"no id: {where}: no id field {self.id_field!r}")
            doc_id = str(rec[self.id_field])
        else:
            doc_id = str(rec["id"]) if isinstance(rec.get("id"), (str, int)) else where
        body = rec.get(self.key)
        if self.clusters:
            if not isinstance(body, list) or not body or not all(isinstance(d, str) for d in body):
                return Record(pos, doc_id, skipped=f"no text: {where}: no list of document strings in {self.key!r}")
            if not any(d.strip() for d in body):
                return Record(pos, doc_id, skipped=f"empty: {where}: every document of the cluster is empty")
            texts = body
        else:
            if not isinstance(body, str):
                return Record(pos, doc_id, skipped=f"no text: {where}: no text field {self.key!r}")
            if not body.strip():
                return Record(pos, doc_id, skipped=f"empty: {where}: field {self.key!r} is empty")
            texts = [body]
        try:
            for k, text in enumerate(texts):
                check_length(text, f"{where} (document {k + 1})" if self.clusters else where, self.max_chars)
        except InputError as e:
            return Record(pos, doc_id, skipped=f"too long: {e}")
        return Record(pos, doc_id, body)


# ---------------------------------------------------------------------------------------------- part files
def part_path(output: Path, shard: Shard) -> Path:
    return output.with_name(f"{output.name}.part-{shard.index:05d}-of-{shard.count:05d}")


def done_path(part: Path) -> Path:
    return part.with_name(part.name + ".done")


def stats_path(output: Path) -> Path:
    return output.with_name(output.name + ".stats.json")


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
        last = json.loads(tail[:cut].rsplit(b"\n", 1)[-1])
        return int(last["index"]), last.get("id")


@dataclass
class ShardResult:
    written: int = 0
    summarized: int = 0
    skipped: Counter = field(default_factory=Counter)
    resumed_after: int = -1


def summarize_shard(summarize_all: Callable[[list], list[Summary]], source: Source, output: Path, shard: Shard,
                    window: int = 64, on_window: Callable[[int], None] | None = None) -> ShardResult:
    """This shard's records into its part file, a window at a time; resumes after the part's last line."""
    part = part_path(output, shard)
    result = ShardResult()
    if done_path(part).is_file():
        d = json.loads(done_path(part).read_text())
        return ShardResult(d["written"], d["summarized"], Counter(d["skipped"]), d["resumed_after"])
    after, last_id = last_written(part)
    result.resumed_after = after
    if after >= 0:   # what the part already holds counts toward this shard's totals
        with open(part, "rb") as f:
            for line in f:
                rec = json.loads(line)
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
    part.parent.mkdir(parents=True, exist_ok=True)
    with open(part, "ab") as out:
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
    done = {"written": result.written, "summarized": result.summarized, "skipped": dict(result.skipped),
            "resumed_after": result.resumed_after}
    done_path(part).write_text(json.dumps(done))
    return result


def merge(output: Path, count: int, source_name: str = "") -> dict[str, Any]:
    """The `count` finished parts merged by input position into `output`; returns (and writes) the stats."""
    parts = [part_path(output, Shard(i, count)) for i in range(count)]
    missing = [p.name for p in parts if not done_path(p).is_file()]
    if missing:
        raise UserError(f"{output}: {len(missing)} of {count} shards are not finished ({', '.join(missing[:3])}"
                        f"{', ...' if len(missing) > 3 else ''}): run them (or rerun the command) before merging")
    tmp = output.with_name(output.name + ".tmp")
    summarized, skipped, n = 0, Counter(), 0
    _allow_open_files(count + 64)
    files = [open(p, "rb") for p in parts]
    try:
        def keyed(f):
            for line in f:
                yield json.loads(line)["index"], line
        with open(tmp, "wb") as out:
            for _, line in heapq.merge(*(keyed(f) for f in files), key=lambda t: t[0]):
                out.write(line)
                n += 1
            out.flush()
            os.fsync(out.fileno())
    finally:
        for f in files:
            f.close()
    for p in parts:
        d = json.loads(done_path(p).read_text())
        summarized += d["summarized"]
        skipped.update(d["skipped"])
    stats = {"input": source_name, "records_in": n, "summarized": summarized, "skipped": dict(skipped),
             "shards": count, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if summarized + sum(skipped.values()) != n:
        raise UserError(f"{output}: the parts hold {n} lines but their shards counted {summarized} summarized + "
                        f"{sum(skipped.values())} skipped; remove the part files and run again")
    tmp.replace(output)
    stats_path(output).write_text(json.dumps(stats, indent=1))
    for p in parts:
        p.unlink()
        done_path(p).unlink()
    return stats


def _allow_open_files(n: int) -> None:
    """The merge holds every part open at once: raise the soft limit toward the hard one where it is lower."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if hard != resource.RLIM_INFINITY and hard < n:
        raise UserError(f"merging {n - 64} parts needs {n} open files, above this process's hard limit {hard} "
                        "(ulimit -Hn): use fewer shards")


def stats_line(stats: dict[str, Any], output: Path) -> str:
    skipped = sum(stats["skipped"].values())
    why = ", ".join(f"{k} {v}" for k, v in sorted(stats["skipped"].items()))
    return (f"{stats['records_in']} records in: {stats['summarized']} summarized + {skipped} skipped"
            f"{f' ({why})' if why else ''} -> {output} (in input order; stats: {stats_path(output)})")
