"""The on-disk shard format: one directory per (split, shard) of raw `.npy` arrays, memory-mapped on read.

    <dataset>/<split>/shard-00003/
      tokens.npy          int32   sentence token ids, concatenated (no specials, <= max_sentence_tokens each)
      sent_offsets.npy    int64   [S+1] sentence k = tokens[sent_offsets[k]:sent_offsets[k+1]]
      chunk_offsets.npy   int64   [C+1] chunk j = sentences chunk_offsets[j]:chunk_offsets[j+1]
      text.npy            uint8   UTF-8 sentence text (readable, whole sentence even when its ids are cut)
      text_offsets.npy    int64   [S+1]
      labels.npy          uint8   [S] oracle label per sentence (0 where the document has no summary)
      chunk_src.npy       int64   [C] source document (row of the src_* arrays) of each chunk
      chunk_no.npy        int32   [C] chunk number within its source document
      src_ids.npy         uint8   UTF-8 document ids; src_id_offsets.npy int64 [D+1]
      src_hash.npy        uint64  [D] hash of the whitespace-normalized text (exact-duplicate removal)
      src_order.npy       int64   [D] position in the whole input (the first copy of a duplicate wins)
      src_source.npy      int32   [D] index of the data source
      src_has_summary.npy uint8   [D]
      src_stats.npy       int32   [D, 3] words, truncated sentences, dropped empty sentences
      sum_tokens.npy, sum_sent_offsets.npy, sum_doc_offsets.npy [D+1], sum_text.npy, sum_text_offsets.npy
                                  the reference summary of each source document, segmented and encoded
    clusters only (a cluster is one chunk):
      unit_offsets.npy    int64   [U+1] unit u = sentences unit_offsets[u]:unit_offsets[u+1]
      chunk_unit_offsets.npy int64 [C+1] chunk j = units chunk_unit_offsets[j]:chunk_unit_offsets[j+1]
      unit_doc.npy        int32   [U] document (within its cluster) of each unit
      unit_scores.npy     float32 [U] ROUGE-2 recall of the unit against the summary (0 without one)
      src_title.npy       uint8   UTF-8 cluster titles ("" when none); src_title_offsets.npy int64 [D+1]
    written by merge (data_prep/integrity.py):
      checksums.json              {array file: {bytes, sha256}}; the manifest records this file's own checksum
      .verified.json              the stat cache of the last check (not part of the dataset's content)
Everything is plain numbers (np.load(allow_pickle=False)); nothing is pickled.
"""
from __future__ import annotations

import os
import shutil
from array import array
from pathlib import Path

import numpy as np

SPLITS = ("train", "valid", "test")


def shard_name(i: int) -> str:
    return f"shard-{i:05d}"


def load_array(path: Path) -> np.ndarray:
    """Memory-mapped, never unpickled. Returned as a plain ndarray view of the mapping: indexing an
    np.memmap builds a memmap object per access, 3x the cost of a view (the loader indexes per sentence)."""
    return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))


class _Strings:
    """Strings as one UTF-8 byte buffer plus offsets."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.offsets = array("q", [0])

    def add(self, s: str) -> None:
        self.data += s.encode("utf-8")
        self.offsets.append(len(self.data))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.frombuffer(bytes(self.data), dtype=np.uint8), np.frombuffer(self.offsets, dtype=np.int64)


class _Sentences:
    """Encoded sentences + their text."""

    def __init__(self) -> None:
        self.tokens = array("i")
        self.offsets = array("q", [0])
        self.text = _Strings()

    def add(self, ids: list[int], text: str) -> None:
        self.tokens.extend(ids)
        self.offsets.append(len(self.tokens))
        self.text.add(text)

    def __len__(self) -> int:
        return len(self.offsets) - 1


class SplitWriter:
    """Accumulates one split of one shard in memory and writes it in one go."""

    def __init__(self, clusters: bool = False) -> None:
        self.clusters = clusters
        self.unit_offsets = array("q", [0])
        self.chunk_unit_offsets = array("q", [0])
        self.unit_doc = array("i")
        self.unit_scores = array("f")
        self.src_title = _Strings()
        self.sents = _Sentences()
        self.labels = array("B")
        self.chunk_offsets = array("q", [0])
        self.chunk_src = array("q")
        self.chunk_no = array("i")
        self.src_ids = _Strings()
        self.src_hash = array("Q")
        self.src_order = array("q")
        self.src_source = array("i")
        self.src_has_summary = array("B")
        self.src_stats = array("i")
        self.summ = _Sentences()
        self.sum_doc_offsets = array("q", [0])

    @property
    def num_docs(self) -> int:
        return len(self.src_hash)

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_src)

    def add_document(self, doc_id: str, content_hash: int, order: int, source: int,
                     chunks: list[list[tuple[list[int], str]]], labels: list[int] | None,
                     summary: list[tuple[list[int], str]] | None, stats: tuple[int, int, int] = (0, 0, 0),
                     units: tuple[list[tuple[int, int]], list[int], "np.ndarray | None", str] | None = None) -> None:
        """chunks: per chunk, (ids, text) per sentence; labels: one per sentence over all chunks;
        stats: (words, truncated sentences, dropped empty sentences); units (clusters: one chunk): the
        (start, end) sentence range of each unit within it, each unit's document, scores, the title."""
        src = self.num_docs
        if self.clusters:
            if units is None or len(chunks) != 1:
                raise ValueError("a cluster is written as one chunk with its units")
            spans, docs, scores, title = units
            base = len(self.sents)
            for a, b in spans:
                self.unit_offsets.append(base + b)
                if a != (self.unit_offsets[-2] - base):
                    raise ValueError("units must cover the cluster's sentences in order")
            self.chunk_unit_offsets.append(len(self.unit_doc) + len(spans))
            self.unit_doc.extend(docs)
            self.unit_scores.extend(np.zeros(len(spans), np.float32) if scores is None else scores)
            self.src_title.add(title)
        self.src_ids.add(doc_id)
        self.src_hash.append(content_hash)
        self.src_order.append(order)
        self.src_source.append(source)
        self.src_has_summary.append(summary is not None)
        self.src_stats.extend(stats)
        for no, chunk in enumerate(chunks):
            for ids, text in chunk:
                self.sents.add(ids, text)
            self.chunk_offsets.append(len(self.sents))
            self.chunk_src.append(src)
            self.chunk_no.append(no)
        n = sum(len(c) for c in chunks)
        self.labels.extend(labels if labels is not None else [0] * n)
        for ids, text in summary or []:
            self.summ.add(ids, text)
        self.sum_doc_offsets.append(len(self.summ))

    def write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        text, text_offsets = self.sents.text.arrays()
        ids, id_offsets = self.src_ids.arrays()
        sum_text, sum_text_offsets = self.summ.text.arrays()
        arrays = {
            "tokens": np.frombuffer(self.sents.tokens, dtype=np.int32),
            "sent_offsets": np.frombuffer(self.sents.offsets, dtype=np.int64),
            "chunk_offsets": np.frombuffer(self.chunk_offsets, dtype=np.int64),
            "text": text, "text_offsets": text_offsets,
            "labels": np.frombuffer(self.labels, dtype=np.uint8),
            "chunk_src": np.frombuffer(self.chunk_src, dtype=np.int64),
            "chunk_no": np.frombuffer(self.chunk_no, dtype=np.int32),
            "src_ids": ids, "src_id_offsets": id_offsets,
            "src_hash": np.frombuffer(self.src_hash, dtype=np.uint64),
            "src_order": np.frombuffer(self.src_order, dtype=np.int64),
            "src_source": np.frombuffer(self.src_source, dtype=np.int32),
            "src_has_summary": np.frombuffer(self.src_has_summary, dtype=np.uint8),
            "src_stats": np.frombuffer(self.src_stats, dtype=np.int32).reshape(-1, 3),
            "sum_tokens": np.frombuffer(self.summ.tokens, dtype=np.int32),
            "sum_sent_offsets": np.frombuffer(self.summ.offsets, dtype=np.int64),
            "sum_doc_offsets": np.frombuffer(self.sum_doc_offsets, dtype=np.int64),
            "sum_text": sum_text, "sum_text_offsets": sum_text_offsets,
        }
        if self.clusters:
            title, title_offsets = self.src_title.arrays()
            arrays.update({"unit_offsets": np.frombuffer(self.unit_offsets, dtype=np.int64),
                           "chunk_unit_offsets": np.frombuffer(self.chunk_unit_offsets, dtype=np.int64),
                           "unit_doc": np.frombuffer(self.unit_doc, dtype=np.int32),
                           "unit_scores": np.frombuffer(self.unit_scores, dtype=np.float32),
                           "src_title": title, "src_title_offsets": title_offsets})
        for name, arr in arrays.items():
            np.save(directory / f"{name}.npy", arr, allow_pickle=False)


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished directory into place (removing a stale one from an earlier attempt)."""
    if final.exists():
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, final)


class ShardPart:
    """Read side of one split of one shard: lazily memory-mapped arrays."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)

    def __getattr__(self, name: str) -> np.ndarray:
        """Only called for names not yet set: map `<name>.npy` once and keep it as a plain attribute, so
        later reads are ordinary attribute lookups (the loader reads a few arrays per document)."""
        if name.startswith("_") or name == "dir":
            raise AttributeError(name)
        path = self.dir / f"{name}.npy"
        if not path.is_file():
            raise AttributeError(f"{self.dir} has no {name}.npy")
        arr = load_array(path)
        setattr(self, name, arr)
        return arr

    def release(self) -> None:
        """Drop the mapped arrays: each holds an open file (mmap keeps a descriptor), so a process that walks
        thousands of shards must not keep them all (the limit is ~1,024 per process by default). Arrays a
        caller still holds stay valid; the file closes with the last of them."""
        for name in [k for k in vars(self) if k != "dir"]:
            delattr(self, name)

    @staticmethod
    def _strings(data: np.ndarray, offsets: np.ndarray, a: int, b: int) -> list[str]:
        o = offsets[a:b + 1]
        raw = bytes(data[o[0]:o[-1]])
        base = int(o[0])
        return [raw[int(x) - base:int(y) - base].decode("utf-8") for x, y in zip(o[:-1], o[1:])]

    def chunk_sentences(self, j: int) -> tuple[int, int]:
        return int(self.chunk_offsets[j]), int(self.chunk_offsets[j + 1])

    def token_arrays(self, a: int, b: int, tokens: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
        o = np.asarray(offsets[a:b + 1])
        flat = np.array(tokens[o[0]:o[-1]], dtype=np.int32)   # one copy out of the memmap
        cuts = (o - o[0]).tolist()
        return [flat[x:y] for x, y in zip(cuts[:-1], cuts[1:])]  # views; np.split is 5x slower here

    @staticmethod
    def token_flat(a: int, b: int, tokens: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sentences a..b-1 as (their tokens back to back, int32, a copy; tokens per sentence, int64)."""
        o = offsets[a:b + 1]
        return np.array(tokens[o[0]:o[-1]], dtype=np.int32), (o[1:] - o[:-1]).astype(np.int64, copy=False)

    def src_id(self, src: int) -> str:
        return self._strings(self.src_ids, self.src_id_offsets, src, src + 1)[0]
