"""Where a corpus summarized with `hibert summarize --output` comes from: a JSON Lines file read line by line, or
a `datasets.save_to_disk` directory read by index from its memory-mapped Arrow files; its records split into
shards (record i belongs to shard i mod N). A record that cannot be summarized (bad JSON, no text, too long,
...) comes out as a skipped `Record` with its reason: records in = summarized + skipped (finetune/inference/corpus.py
writes both)."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hibert.data_prep.readers.files import open_binary
from hibert.errors import UserError
from hibert.finetune.inference.text import InputError, check_length, is_json_lines
from hibert.json_lines import INVALID_UTF8, MALFORMED_JSON, NOT_OBJECT, TOO_LONG, BadLine, json_lines


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


# the one reader's bad lines (hibert/json_lines.py) as the reasons a skipped record's line gives
_SKIPPED = {INVALID_UTF8: "not UTF-8", MALFORMED_JSON: "invalid JSON", NOT_OBJECT: "not an object",
            TOO_LONG: "too long"}


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
        if self.path.is_file():
            self.name = self.path.name
            return
        # the split is resolved here, once: every process (and the stats) names the one that is read
        splits = self._splits()
        if splits is not None:
            self.split = self.split or ("test" if "test" in splits else splits[0])
            if self.split not in splits:
                raise UserError(f"--input {self.path}: no split {self.split!r} (splits: {', '.join(splits)})")
        self.name = f"{self.path.name}[{self.split or 'train'}]"

    def _splits(self) -> list[str] | None:
        """The splits of a saved DatasetDict (its dataset_dict.json), None for a single saved Dataset."""
        index = self.path / "dataset_dict.json"
        if not index.is_file():
            return None
        try:
            splits = json.loads(index.read_text())["splits"]
            assert isinstance(splits, list) and splits and all(isinstance(x, str) for x in splits)
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            raise UserError(f"--input {self.path}: cannot read its dataset_dict.json (not a dataset saved with "
                            "datasets' save_to_disk, or damaged)") from None
        return splits

    def check(self) -> None:
        """Open a dataset input once, so that a damaged one is reported as an input problem, before any model
        loads (a JSONL input is read line by line, its bad lines skipped and counted, but a pretty-printed JSON
        file, whose every line would be skipped, is refused here)."""
        if not self.path.is_dir():
            self._check_json_lines()
            return
        try:
            len(self._dataset())
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - datasets/pyarrow raise many types for a damaged directory
            raise UserError(f"--input {self.path}: cannot read the saved dataset ({type(e).__name__}: "
                            f"{str(e)[:200]})") from None

    def _check_json_lines(self) -> None:
        try:
            with open_binary(self.path, self.max_line_bytes) as f:
                first = next((line.strip() for line in f if line.strip()), b"")
        except OSError:
            return   # reported where the records are read
        if first in (b"[", b"{") or (first.startswith(b"[") and not _parses(first)):
            raise UserError(f"--input {self.path}: pretty-printed JSON, not JSON lines (one object per line); "
                            f"convert it, e.g. jq -c '.[]' {self.path} > {self.path.stem}.jsonl")

    @property
    def max_line_bytes(self) -> int:
        """A record's line may hold at most this (a character is at most 12 bytes of JSON): a longer one is a
        counted skip, read past without being held in memory."""
        return 12 * self.max_chars

    @property
    def key(self) -> str:
        return ("documents" if self.field == "text" else self.field) if self.clusters else self.field

    # ------------------------------------------------------------------------------------------ reading
    def _dataset(self):
        from datasets import DatasetDict, load_from_disk  # lazy: ~0.6 s, only for a saved-dataset input

        ds = load_from_disk(str(self.path))
        if isinstance(ds, DatasetDict):
            if self.split not in ds:
                raise UserError(f"--input {self.path}: no split {self.split!r} (splits: {', '.join(ds)})")
            ds = ds[self.split]
        return ds

    def count(self, shard: "Shard | None" = None) -> int:
        """Records in the input (JSONL: non-blank lines) that `shard` owns (all: None), for the progress bar."""
        shard = shard or Shard()
        if self.path.is_dir():
            return len(range(shard.index, len(self._dataset()), shard.count))
        with open_binary(self.path, self.max_line_bytes) as f:
            return sum(1 for pos, line in enumerate(f) if shard.owns(pos) and line.strip())

    def records(self, shard: Shard, after: int = -1) -> Iterator[Record]:
        """The shard's records past position `after`, in input order; bad ones as skipped records."""
        if self.path.is_dir():
            ds = self._dataset()
            start = shard.index if after < 0 else after + 1 + (shard.index - after - 1) % shard.count
            for i in range(start, len(ds), shard.count):
                yield self._record(i, ds[i], f"{self.name}:{i + 1}")
            return
        with open_binary(self.path, self.max_line_bytes) as f:   # plain or gzip; no line held past the limit
            for got in json_lines(f, part=shard.index, parts=shard.count, after=after + 1,
                                  max_bytes=self.max_line_bytes):
                if isinstance(got, BadLine):
                    where = f"{self.name}:{got.lineno}"
                    yield Record(got.lineno - 1, where, skipped=f"{_SKIPPED[got.kind]}: {where}: {got.detail}")
                else:
                    yield self._record(got[0] - 1, got[1], f"{self.name}:{got[0]}")

    def _record(self, pos: int, rec: dict[str, Any], where: str) -> Record:
        if self.id_field:
            if rec.get(self.id_field) is None:
                return Record(pos, where, skipped=f"no id: {where}: no id field {self.id_field!r}")
            doc_id = str(rec[self.id_field])
        else:
            doc_id = str(rec["id"]) if isinstance(rec.get("id"), (str, int)) else where
        body = rec.get(self.key)
        # JSON can spell lone surrogates (\ud800), which no UTF-8 output line can hold
        if not _utf8(doc_id) or not all(_utf8(t) for t in (body if isinstance(body, list) else [body])
                                        if isinstance(t, str)):
            return Record(pos, where, skipped=f"invalid text: {where}: a lone surrogate (not encodable as UTF-8)")
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


_SURROGATE = re.compile("[\ud800-\udfff]")   # a lone JSON "\ud800" escape: the one text UTF-8 cannot write


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _utf8(text: str) -> bool:
    return _SURROGATE.search(text) is None


# ---------------------------------------------------------------------------------------------- part files
