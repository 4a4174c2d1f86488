"""`DocumentDataset`: O(1) random access to the document chunks of one split of a prepared dataset.

Opening reads manifest.json and memory-maps four small per-split index arrays; shard arrays are mapped on
first touch. Nothing is unpickled, and a pickled dataset carries only its path, so it opens cheaply again
in (forked or spawned) DataLoader workers.
"""
from __future__ import annotations

import json
import logging
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from hibert.data_prep.integrity import shard_files, verify
from hibert.data_prep.shards import SPLITS, ShardPart, load_array, shard_name
from hibert.open_files import raise_soft_limit

log = logging.getLogger("hibert.data")

# Shards whose arrays a dataset keeps mapped (least recently read released first). None: as many as the process's
# open-file limit allows, all its datasets together (`mapped_array_budget`); a number fixes it per dataset (tests).
OPEN_SHARDS: int | None = None
RESERVED_FDS = 512       # for everything else a training process opens (DataLoader pipes, sockets, checkpoints)
MAX_MAPPED_ARRAYS = 32768    # the soft limit is raised no further than this (plus RESERVED_FDS) needs
MIN_MAPPED_ARRAYS = 256
_BUDGET: int | None = None
_OPEN: "weakref.WeakSet[DocumentDataset]" = weakref.WeakSet()   # this process's datasets (their mapped arrays)

MANIFEST = "manifest.json"
# (dataset, split) whose files this process checked -> (its shards' manifest records by shard, the shards
# already checked)
_CHECKED: dict[tuple[str, str], tuple[dict[str, dict[str, Any]], set[int]]] = {}
TOKENIZER = "tokenizer.model"


# What a dataset keeps of its manifest once the files are checked: not the records that grow with the shard and
# input-file counts (checksums, per-file source counts, per-shard timings and lists: 17 MB of Python objects at
# 10,000 shards, kept by every DataLoader worker); readers need the summary (kind, synthetic, counts, settings).
_PER_FILE_AND_SHARD = ("files", "sources", "shard_seconds")


def _summary(manifest: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in manifest.items() if k not in _PER_FILE_AND_SHARD}
    if isinstance(out.get("splits"), dict):
        out["splits"] = {name: {k: v for k, v in split.items() if k != "shards"} if isinstance(split, dict) else split
                         for name, split in out["splits"].items()}
    return out


def array_budget(soft: float, hard: float) -> tuple[float, int]:
    """(the soft open-file limit to set, the arrays this process's datasets may keep mapped) for limits (soft,
    hard); either may be unlimited (math.inf, or any value >= 2**62). Every mapped array holds a descriptor."""
    want = RESERVED_FDS + MAX_MAPPED_ARRAYS
    unlimited = 2**62
    if soft < unlimited and soft < want:
        soft = max(soft, want if hard >= unlimited else min(want, hard))
    limit = want if soft >= unlimited else soft
    return soft, max(MIN_MAPPED_ARRAYS, min(MAX_MAPPED_ARRAYS, int(limit) - RESERVED_FDS))


def mapped_array_budget() -> int:
    """How many shard arrays this process keeps mapped, all its datasets together: as many as the open-file limit
    allows. A training plan reads documents in a random order; with fewer shards kept than it reads, almost every
    document reopens its shard (240 shards, 64 kept: 54.6 ms per HIBERT_M micro-batch in make_item against 7.1
    with all kept, docs/performance.md). The soft limit is raised toward the hard one, as far as
    MAX_MAPPED_ARRAYS needs (as the corpus merge does); at a 1,024 limit, 512 arrays (170 pretraining shards)."""
    global _BUDGET
    if _BUDGET is None:
        soft, _ = raise_soft_limit(RESERVED_FDS + MAX_MAPPED_ARRAYS)
        _BUDGET = array_budget(soft, soft)[1]   # the limit in force (a raise can be refused)
    return _BUDGET


def _mapped(part: ShardPart) -> int:
    return len(vars(part)) - 1   # its mapped arrays (attributes besides `dir`)


def mapped_estimate() -> int:
    """Arrays this process's datasets hold mapped: each dataset's kept shards times the most arrays one of its
    shards has mapped (a shard maps its arrays as they are first read; a task reads the same ones from each)."""
    return sum(len(d._parts) * d._per_shard for d in list(_OPEN))


class DocumentDataset:
    """Item i = one document chunk: its sentences as int32 token-id arrays (no specials).

    Vectorized, without touching token data: `doc_num_sentences`, `doc_num_tokens` (per chunk) and
    `doc_source` (a per-split number of the source document, shared by its chunks)."""

    def __init__(self, dataset_dir: str | Path, split: str):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        self.dir = Path(dataset_dir)
        self.split = split
        path = self.dir / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"{self.dir} is not a prepared dataset (no {MANIFEST}); run `hibert prep`")
        self.manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        key = (str(self.dir.resolve()), split)
        if key not in _CHECKED:  # the cheap check, once per process and split; shards as they are first read
            if not self.manifest.get("files") and not any(k[0] == key[0] for k in _CHECKED):  # once per dataset
                log.warning("%s records no checksums (prepared before they existed): a damaged file would not be "
                            "found; `hibert prep --record-checksums data.dataset=%s` records them", self.dir, self.dir)
            verify(self.dir, self.manifest, split=split, shards=False)
            _CHECKED[key] = (shard_files(self.manifest, split), set())
        self._shard_check = _CHECKED[key]
        self.manifest = _summary(self.manifest)
        self.tokenizer_path = self.dir / TOKENIZER
        d = self.dir / split
        self._index = load_array(d / "index.npy")                  # [N, 2]: shard, chunk within the shard
        self.doc_num_sentences = load_array(d / "doc_num_sentences.npy")
        self.doc_num_tokens = load_array(d / "doc_num_tokens.npy")
        self.doc_source = load_array(d / "doc_source.npy")
        self.is_clusters = self.manifest.get("kind") == "clusters"
        self.doc_num_units = load_array(d / "doc_num_units.npy") if self.is_clusters else None
        # the shards read most recently, their arrays mapped; older ones are released (each mapped array holds
        # an open file: an epoch over 10,000 shards would otherwise hit the process's open-file limit)
        self._parts: OrderedDict[int, ShardPart] = OrderedDict()
        self._per_shard = 1   # the most arrays one of its shards has mapped (what the reader touches)
        _OPEN.add(self)

    def __getstate__(self) -> dict[str, Any]:
        return {"dir": str(self.dir), "split": self.split}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dir"], state["split"])

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"DocumentDataset({str(self.dir)!r}, {self.split!r}, chunks={len(self)})"

    def _locate(self, i: int) -> tuple[ShardPart, int]:
        n = len(self._index)
        if not -n <= i < n:
            raise IndexError(f"chunk {i} out of range for {n} chunks")
        shard, local = self._index[i].tolist()
        part = self._parts.get(shard)
        if part is None:
            files, checked = self._shard_check
            if shard not in checked:   # its files' sizes (and sha256 where changed), once per process
                verify(self.dir, self.manifest, files=files.get(shard_name(shard), {}))
                checked.add(shard)
            if self._parts:  # the shard read last has mapped what this reader touches
                self._per_shard = max(self._per_shard, _mapped(next(reversed(self._parts.values()))))
            part = self._parts[shard] = ShardPart(self.dir / self.split / shard_name(shard))
            if OPEN_SHARDS is not None:
                while len(self._parts) > OPEN_SHARDS:
                    self._parts.popitem(last=False)[1].release()
            else:
                budget = mapped_array_budget()
                while len(self._parts) > 1 and mapped_estimate() > budget:
                    self._parts.popitem(last=False)[1].release()
        else:
            self._parts.move_to_end(shard)
        return part, local

    def __getitem__(self, i: int) -> list[np.ndarray]:
        part, j = self._locate(i)
        a, b = part.chunk_sentences(j)
        return part.token_arrays(a, b, part.tokens, part.sent_offsets)

    def flat(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk i as (its tokens back to back, int32, a copy; tokens per sentence, int64)."""
        part, j = self._locate(i)
        a, b = part.chunk_sentences(j)
        return part.token_flat(a, b, part.tokens, part.sent_offsets)

    def sentences_text(self, i: int) -> list[str]:
        part, j = self._locate(i)
        a, b = part.chunk_sentences(j)
        return part._strings(part.text, part.text_offsets, a, b)

    def doc_id(self, i: int) -> str:
        """`<source doc id>#<chunk number>`."""
        part, j = self._locate(i)
        return f"{part.src_id(int(part.chunk_src[j]))}#{int(part.chunk_no[j])}"

    def source_doc(self, i: int) -> str:
        """The id of the document this chunk came from (shared by all its chunks)."""
        part, j = self._locate(i)
        return part.src_id(int(part.chunk_src[j]))

    def chunk_index(self, i: int) -> int:
        part, j = self._locate(i)
        return int(part.chunk_no[j])

    def _summary_range(self, i: int) -> tuple[ShardPart, int, int] | None:
        part, j = self._locate(i)
        src = int(part.chunk_src[j])
        if not part.src_has_summary[src]:
            return None
        return part, int(part.sum_doc_offsets[src]), int(part.sum_doc_offsets[src + 1])

    def summary_text(self, i: int) -> list[str] | None:
        r = self._summary_range(i)
        return None if r is None else r[0]._strings(r[0].sum_text, r[0].sum_text_offsets, r[1], r[2])

    def summary(self, i: int) -> list[np.ndarray] | None:
        r = self._summary_range(i)
        return None if r is None else r[0].token_arrays(r[1], r[2], r[0].sum_tokens, r[0].sum_sent_offsets)

    def labels(self, i: int) -> np.ndarray | None:
        """Oracle label (0/1) per sentence of the chunk; None when the document has no summary."""
        part, j = self._locate(i)
        if not part.src_has_summary[int(part.chunk_src[j])]:
            return None
        a, b = part.chunk_sentences(j)
        return np.array(part.labels[a:b], dtype=np.uint8)

    # ------------------------------------------------------------------ clusters
    def _cluster(self, i: int) -> tuple[ShardPart, int, int, int]:
        if not self.is_clusters:
            raise ValueError(f"{self.dir} holds documents, not clusters")
        part, j = self._locate(i)
        return part, j, int(part.chunk_unit_offsets[j]), int(part.chunk_unit_offsets[j + 1])

    def unit_offsets(self, i: int) -> np.ndarray:
        """[U+1] int64: unit u of cluster i = sentences o[u]:o[u+1] of `self[i]`."""
        part, j, a, b = self._cluster(i)
        first = int(part.chunk_offsets[j])
        return np.concatenate([[first], np.asarray(part.unit_offsets[a + 1:b + 1])]).astype(np.int64) - first

    def unit_docs(self, i: int) -> np.ndarray:
        """[U] int32: the document (0-based within the cluster) of each unit."""
        part, _, a, b = self._cluster(i)
        return np.array(part.unit_doc[a:b], dtype=np.int32)

    def unit_scores(self, i: int) -> np.ndarray | None:
        """[U] float32 ROUGE-2 recall of each unit against the summary; None without a summary."""
        part, j, a, b = self._cluster(i)
        if not part.src_has_summary[int(part.chunk_src[j])]:
            return None
        return np.array(part.unit_scores[a:b], dtype=np.float32)

    def units(self, i: int) -> list[list[np.ndarray]]:
        sents, o = self[i], self.unit_offsets(i)
        return [sents[o[u]:o[u + 1]] for u in range(len(o) - 1)]

    def units_text(self, i: int) -> list[list[str]]:
        sents, o = self.sentences_text(i), self.unit_offsets(i)
        return [sents[o[u]:o[u + 1]] for u in range(len(o) - 1)]

    def title_ids(self, i: int) -> list[np.ndarray] | None:
        """The cluster's title as one sentence of subword ids (no specials), encoded with the dataset's own
        tokenizer as its sentences were; None without a title."""
        text = self.title(i)
        if text is None:
            return None
        if getattr(self, "_sp", None) is None:  # per process: __getstate__ leaves it out
            from hibert.data_prep.tokenizer import load  # lazy: +~0.1 s (config schema); only where titles are read

            self._sp = load(self.tokenizer_path)
        return [np.asarray(self._sp.encode(text, out_type=int), dtype=np.int64)]

    def title(self, i: int) -> str | None:
        part, j, _, _ = self._cluster(i)
        src = int(part.chunk_src[j])
        t = part._strings(part.src_title, part.src_title_offsets, src, src + 1)[0]
        return t or None
