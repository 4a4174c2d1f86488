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
      src_cluster_stats.npy int32 [D, 3] documents, units dropped (max_cluster_units), synthetic (0/1)
    written by merge (data_prep/integrity.py):
      checksums.json              {array file: {bytes, sha256}}; the manifest records this file's own checksum
      .verified.json              the stat cache of the last check (not part of the dataset's content)
Everything is plain numbers (np.load(allow_pickle=False)); nothing is pickled.
"""
from __future__ import annotations

import io
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


_HEADER = 128  # bytes np.save writes before the data of a 1-2 dimensional array (magic, version, dict, padding)
_FLUSH = 1 << 20  # bytes a streamed column buffers before it appends them to its file


class _Column:
    """An append-only array: kept in memory, or, given a path, streamed to that .npy file as it grows (only
    the last < _FLUSH bytes are held) and given its header at `save`: the same bytes np.save writes."""

    def __init__(self, typecode: str, dtype: str, path: Path | None = None, first: int | None = None) -> None:
        self.typecode, self.dtype, self.path = typecode, np.dtype(dtype), path
        self.buf = array(typecode, [] if first is None else [first])
        self.flushed = 0
        self.file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "wb")
            self.file.write(b"\0" * _HEADER)

    def __len__(self) -> int:
        return self.flushed + len(self.buf)

    def append(self, value) -> None:
        self.buf.append(value)
        if self.file is not None and len(self.buf) * self.buf.itemsize >= _FLUSH:
            self._flush()

    def extend(self, values) -> None:
        if isinstance(values, (bytes, bytearray)):
            self.buf.frombytes(values)
        else:
            self.buf.extend(values)
        if self.file is not None and len(self.buf) * self.buf.itemsize >= _FLUSH:
            self._flush()

    def _flush(self) -> None:
        self.buf.tofile(self.file)
        self.flushed += len(self.buf)
        self.buf = array(self.typecode)

    def save(self, path: Path, shape: tuple[int, ...] | None = None) -> None:
        if self.file is None:
            np.save(path, np.frombuffer(self.buf, dtype=self.dtype).reshape(shape or (-1,)), allow_pickle=False)
            return
        if Path(path) != self.path:
            raise ValueError(f"{self.path} streams to its own file, not {path}")
        self._flush()
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                      "fortran_order": False, "shape": shape or (self.flushed,)})
        if len(header.getvalue()) != _HEADER:  # only a shape of ~80 digits would need more
            raise ValueError(f"{path}: an .npy header of {len(header.getvalue())} bytes")
        self.file.seek(0)
        self.file.write(header.getvalue())
        self.file.close()
        self.file = None


class _Strings:
    """Strings as one UTF-8 byte column plus offsets."""

    def __init__(self, data_path: Path | None = None, offsets_path: Path | None = None) -> None:
        self.data = _Column("B", "uint8", data_path)
        self.offsets = _Column("q", "int64", offsets_path, first=0)

    def add(self, s: str) -> None:
        self.data.extend(s.encode("utf-8"))
        self.offsets.append(len(self.data))

    def save(self, directory: Path, data: str, offsets: str) -> None:
        self.data.save(directory / f"{data}.npy")
        self.offsets.save(directory / f"{offsets}.npy")


class _Sentences:
    """Encoded sentences + their text (`prefix`: the array names' prefix, `directory`: stream the tokens and
    text there)."""

    def __init__(self, prefix: str = "", directory: Path | None = None) -> None:
        stream = lambda name: None if directory is None else directory / f"{prefix}{name}.npy"  # noqa: E731
        self.prefix = prefix
        self.tokens = _Column("i", "int32", stream("tokens"))
        self.offsets = _Column("q", "int64", stream("sent_offsets"), first=0)
        self.text = _Strings(stream("text"), stream("text_offsets"))

    def add(self, ids: list[int], text: str) -> None:
        self.tokens.extend(ids)
        self.offsets.append(len(self.tokens))
        self.text.add(text)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def save(self, directory: Path) -> None:
        p = self.prefix
        self.tokens.save(directory / f"{p}tokens.npy")
        self.offsets.save(directory / f"{p}sent_offsets.npy")
        self.text.save(directory, f"{p}text", f"{p}text_offsets")


class SplitWriter:
    """Collects one split of one shard. Given its `directory`, it streams the bulk of it — sentence tokens and
    text and their offsets, summary tokens and text — to their files as documents arrive, so a process holds
    per-document fields and a byte per sentence (its label), not the shard (a 128 MB shard of input is ~250 MB
    of tokens and text and ~15 MB of offsets);
    `write` completes the directory. Without one it keeps everything in memory until `write`."""

    def __init__(self, clusters: bool = False, directory: Path | None = None) -> None:
        self.clusters = clusters
        self.directory = None if directory is None else Path(directory)
        self.unit_offsets = array("q", [0])
        self.chunk_unit_offsets = array("q", [0])
        self.unit_doc = array("i")
        self.unit_scores = array("f")
        self.src_title = _Strings()
        self.src_cluster_stats = array("i")
        self.sents = _Sentences("", self.directory)
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
        self.summ = _Sentences("sum_", self.directory)
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
                     units: tuple[list[tuple[int, int]], list[int], "np.ndarray | None", str] | None = None,
                     cluster_stats: tuple[int, int, int] = (0, 0, 0)) -> None:
        """chunks: per chunk, (ids, text) per sentence; labels: one per sentence over all chunks;
        stats: (words, truncated sentences, dropped empty sentences); units (clusters: one chunk): the
        (start, end) sentence range of each unit within it, each unit's document, scores, the title;
        cluster_stats: (documents, dropped units, synthetic)."""
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
            self.src_cluster_stats.extend(cluster_stats)
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
        directory = Path(directory)
        if self.directory is not None and directory != self.directory:
            raise ValueError(f"this writer streams into {self.directory}, not {directory}")
        directory.mkdir(parents=True, exist_ok=True)
        self.sents.save(directory)
        self.summ.save(directory)
        self.src_ids.save(directory, "src_ids", "src_id_offsets")
        arrays = {
            "chunk_offsets": np.frombuffer(self.chunk_offsets, dtype=np.int64),
            "labels": np.frombuffer(self.labels, dtype=np.uint8),
            "chunk_src": np.frombuffer(self.chunk_src, dtype=np.int64),
            "chunk_no": np.frombuffer(self.chunk_no, dtype=np.int32),
            "src_hash": np.frombuffer(self.src_hash, dtype=np.uint64),
            "src_order": np.frombuffer(self.src_order, dtype=np.int64),
            "src_source": np.frombuffer(self.src_source, dtype=np.int32),
            "src_has_summary": np.frombuffer(self.src_has_summary, dtype=np.uint8),
            "src_stats": np.frombuffer(self.src_stats, dtype=np.int32).reshape(-1, 3),
            "sum_doc_offsets": np.frombuffer(self.sum_doc_offsets, dtype=np.int64),
        }
        if self.clusters:
            self.src_title.save(directory, "src_title", "src_title_offsets")
            arrays.update({"unit_offsets": np.frombuffer(self.unit_offsets, dtype=np.int64),
                           "chunk_unit_offsets": np.frombuffer(self.chunk_unit_offsets, dtype=np.int64),
                           "unit_doc": np.frombuffer(self.unit_doc, dtype=np.int32),
                           "unit_scores": np.frombuffer(self.unit_scores, dtype=np.float32),
                           "src_cluster_stats": np.frombuffer(self.src_cluster_stats, dtype=np.int32).reshape(-1, 3)})
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
