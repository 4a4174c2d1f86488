"""One shard, end to end: read -> dedup -> split -> segment -> encode -> limits/chunks -> oracle -> write.

A shard is finished when shards/shard-NNNNN.json exists (written last, atomically); its split directories
are moved into place just before, so a crash leaves either a finished shard or one that is redone.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hibert.config.data import DataConfig
from hibert.data_prep import ptb, readers
from hibert.data_prep import records as R
from hibert.data_prep import tokenizer as tok
from hibert.data_prep.counts import Counts
from hibert.data_prep.oracle import RougeTokenizer, oracle_labels
from hibert.data_prep.plan import write_json
from hibert.data_prep.segment import Segmenter, Sentence, make_segmenter
from hibert.data_prep.shards import SPLITS, SplitWriter, replace_dir, shard_name
from hibert.data_prep.units import rouge2_recall, windows

SHARDS_DIR = "shards"
STAGING = ".tmp"   # <out>/.tmp/shard-NNNNN.<pid>: a shard being written, moved into place when finished
Progress = Callable[[int, int], None]     # (documents read, words) since the last call


def shard_marker(out: Path, shard: int) -> Path:
    return out / SHARDS_DIR / f"{shard_name(shard)}.json"


def shard_done(out: Path, shard: int, plan_hash: str, tokenizer_sha: str) -> bool:
    """Finished with this very plan and tokenizer (anything else is redone)."""
    m = shard_marker(out, shard)
    if not m.is_file():
        return False
    done = json.loads(m.read_text())
    return done.get("plan_hash") == plan_hash and done.get("tokenizer_sha256") == tokenizer_sha


def input_key(source: int, unit: int, ordinal: int) -> int:
    """Position of a record in the whole input, independent of the shard layout: duplicates keep the copy
    with the smallest key, whatever the number of shards."""
    return (source << 52) | (unit << 32) | ordinal


def content_hash(paragraphs: list[str]) -> int:
    return int.from_bytes(hashlib.blake2b("\n".join(paragraphs).encode(), digest_size=8).digest(), "little")


def assign_split(doc_id: str, valid_fraction: float, test_fraction: float) -> str:
    """Deterministic split from a hash of the document id (stable across runs, shard counts and machines)."""
    u = int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "little") / 2**64
    return "test" if u < test_fraction else "valid" if u < test_fraction + valid_fraction else "train"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process
        return True
    return True


def staging_dir(out: Path, shard: int) -> Path:
    """This process's staging directory for `shard`, after removing the shard's staging left by processes that
    are gone (a full disk, kill -9): one process works on a shard at a time, and a leftover is never resumed."""
    for old in (out / STAGING).glob(f"{shard_name(shard)}.*"):
        pid = old.suffix[1:]
        if not pid.isdigit() or int(pid) == os.getpid() or not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return out / STAGING / f"{shard_name(shard)}.{os.getpid()}"


def clear_staging(out: Path) -> None:
    """Every staging directory: called by the merge, once every shard is finished (nothing is staged then)."""
    shutil.rmtree(out / STAGING, ignore_errors=True)


class Sentencizer:
    """Sentences (text, words) of many paragraph lists: PTB rules for PTB sources, stanza for the rest."""

    def __init__(self, cfg: DataConfig, segmenter: Segmenter | None = None):
        self.cfg = cfg
        self._segmenter = segmenter

    @property
    def segmenter(self) -> Segmenter:
        if self._segmenter is None:
            self._segmenter = make_segmenter(self.cfg.segmenter)
            # the segmenter's libraries are long-lived objects (~90k for spaCy alone, ~1M when stanza brings
            # torch). Freezing them keeps the cyclic collector from re-walking them during the run and at
            # interpreter exit (measured with torch loaded: exit 1.0 s -> 0.1 s).
            gc.freeze()
        return self._segmenter

    @staticmethod
    def _ptb(paragraphs: list[str]) -> list[Sentence]:
        return [(ptb.detokenize(t), len(t)) for p in paragraphs for t in ptb.split_sentences(p)]

    def sentences(self, items: list[tuple[list[str], bool]]) -> list[list[Sentence]]:
        """items: (paragraphs, is_ptb) -> per item, its sentences."""
        out: list[Any] = [None] * len(items)
        todo = [i for i, (_, is_ptb) in enumerate(items) if not is_ptb]
        for i, (paragraphs, is_ptb) in enumerate(items):
            if is_ptb:
                out[i] = self._ptb(paragraphs)
        if todo:
            for i, sents in zip(todo, self.segmenter.segment([items[i][0] for i in todo])):
                out[i] = sents
        return out


class ShardProcessor:
    """Holds the heavy objects (segmenter, SentencePiece model) for all the shards a process runs."""

    def __init__(self, cfg: DataConfig, out: Path, plan: dict[str, Any], sentencizer: Sentencizer | None = None):
        self.cfg = cfg
        self.out = out
        self.plan = plan
        self.names = [s["name"] for s in plan["sources"]]
        self.sentencizer = sentencizer or Sentencizer(cfg)
        self.sp = tok.load(out / tok.MODEL_NAME)
        self.sp_sha = tok.file_sha256(out / tok.MODEL_NAME)
        self._rouge: RougeTokenizer | None = None  # built on the first summary: corpora without summaries need no stemmer

    @property
    def rouge(self) -> RougeTokenizer:
        if self._rouge is None:
            self._rouge = RougeTokenizer()
        return self._rouge

    def run(self, shard: int, progress: Progress | None = None) -> dict[str, Any]:
        try:
            return self._run(shard, progress)
        except BaseException:   # a full disk, a stop: the half-written shard's space back now, not at the rerun
            shutil.rmtree(self.out / STAGING / f"{shard_name(shard)}.{os.getpid()}", ignore_errors=True)
            raise

    def _run(self, shard: int, progress: Progress | None) -> dict[str, Any]:
        t0, c0 = time.time(), time.process_time()
        cfg = self.cfg
        if any(not cfg.sources[si].ptb_tokenized for si, *_ in self.plan["shards"][shard]):
            self.sentencizer.segmenter  # load it now (once per process) so setup_seconds can tell it apart
        setup = time.time() - t0
        counts = Counts(len(self.names))
        tmp = staging_dir(self.out, shard)
        if tmp.exists():
            shutil.rmtree(tmp)
        # the writers stream the shard's tokens and text into tmp as they come (memory does not grow with the
        # shard); the finished directories replace the shard's at the end
        writers = {s: SplitWriter(clusters=cfg.is_clusters, directory=tmp / s) for s in SPLITS}
        seen: dict[int, int] = {}          # content hash -> input key of the copy written (only once written:
        # a first copy found unusable later, e.g. an empty summary, must not hide the next one)
        batch: list[tuple[int, R.RawDoc, int, int]] = []
        checksums = {}
        pending_docs = pending_words = 0
        last_report = time.time()
        for si, ui, part, parts in self.plan["shards"][shard]:
            source = cfg.sources[si]
            unit = self.plan["sources"][si]["units"][ui][0]
            if part == 0:  # one shard per unit records its checksum
                checksums[f"{self.names[si]}:{unit}"] = readers.checksum(source, unit)
            records = readers.read(source, self.names[si], unit, cfg.max_doc_chars, part, parts)
            for k, rec in enumerate(records):
                counts.docs_in[si] += 1
                counts.not_relevant[si] += rec.not_relevant
                pending_docs += 1
                if isinstance(rec, R.Skip):
                    counts.skip(si, rec)
                    continue
                key = input_key(si, ui, part + k * parts)
                h = content_hash(rec.paragraphs)
                if cfg.dedup and seen.get(h, key) < key:  # an earlier copy is already written
                    counts.skip(si, R.Skip(R.DUPLICATE, rec.file, rec.line, rec.doc_id))
                    continue
                batch.append((si, rec, h, key))
                if len(batch) >= cfg.segmenter.batch_size:
                    pending_words += self._process(batch, writers, counts, seen)
                    batch = []
                    if progress and time.time() - last_report > 0.5:
                        progress(pending_docs, pending_words)
                        pending_docs = pending_words = 0
                        last_report = time.time()
        if batch:
            pending_words += self._process(batch, writers, counts, seen)
        if progress:
            progress(pending_docs, pending_words)
        return self._finish(shard, tmp, writers, counts, checksums,
                            {"seconds": round(time.time() - t0, 3), "cpu_seconds": round(time.process_time() - c0, 3),
                             "setup_seconds": round(setup, 3)})

    def _process(self, batch: list[tuple[int, R.RawDoc, int, int]], writers: dict[str, SplitWriter],
                 counts: Counts, seen: dict[int, int]) -> int:
        cfg = self.cfg
        items: list[tuple[list[str], bool]] = []
        spans = []
        for si, rec, _, _ in batch:
            ptb, start = cfg.sources[si].ptb_tokenized, len(items)
            if rec.paragraph_doc is not None:   # a cluster: each paragraph alone, so units never cross one
                items += [([p], ptb) for p in rec.paragraphs]
            else:
                items.append((rec.paragraphs, ptb))
            spans.append((start, len(items)))
        items += [(rec.summary, cfg.sources[si].ptb_tokenized) for si, rec, _, _ in batch if rec.summary is not None]
        segmented = self.sentencizer.sentences(items)
        texts = [t for sents in segmented for t, _ in sents]
        ids = iter(self.sp.encode(texts, out_type=int, num_threads=1))  # one core per worker
        encoded = [[(next(ids), t, w) for t, w in sents] for sents in segmented]
        summaries = iter(encoded[spans[-1][1] if spans else 0:])
        words_total = 0
        for (si, rec, h, order), (a, b) in zip(batch, spans):
            summ = next(summaries) if rec.summary is not None else None
            paragraphs = encoded[a:b]
            sents = [x for p in paragraphs for x in p]
            words_total += sum(w for _, _, w in sents)
            kept = [x for x in sents if x[0]]
            counts.stats["empty_sentences_dropped"] += len(sents) - len(kept)
            if not kept:
                counts.skip(si, R.Skip(R.NO_SENTENCES, rec.file, rec.line, rec.doc_id))
                continue
            summary = None
            if summ is not None:
                summary = [(i, t) for i, t, _ in summ if i]
                if not summary:
                    counts.skip(si, R.Skip(R.NO_SENTENCES, rec.file, rec.line, f"{rec.doc_id}: empty summary"))
                    continue
            if cfg.dedup and seen.get(h, order) < order:  # a copy earlier in this batch was written
                counts.skip(si, R.Skip(R.DUPLICATE, rec.file, rec.line, rec.doc_id))
                continue
            seen[h] = min(seen.get(h, order), order)
            if rec.paragraph_doc is not None:
                self._write_cluster(si, rec, h, order, paragraphs, summary, writers, counts)
            else:
                self._write(si, rec, h, order, kept, summary, writers, counts, len(sents) - len(kept))
        return words_total

    def _write_cluster(self, si: int, rec: R.RawDoc, h: int, order: int,
                       paragraphs: list[list[tuple[list[int], str, int]]], summary: list[tuple[list[int], str]] | None,
                       writers: dict[str, SplitWriter], counts: Counts) -> None:
        """A cluster as one chunk: its sentences in document order, cut into units (paragraphs, or windows of
        <= max_unit_sentences), each unit with its document and, with a summary, its ROUGE-2 recall."""
        cfg = self.cfg
        limit = cfg.max_sentence_tokens
        full: list[tuple[list[int], str, int]] = []
        units: list[tuple[int, int]] = []
        unit_doc: list[int] = []
        dropped = 0
        for p, doc in zip(paragraphs, rec.paragraph_doc or []):
            kept = [x for x in p if x[0]]
            dropped += len(p) - len(kept)
            base = len(full)
            for a, b in windows(len(kept), cfg.max_unit_sentences):
                units.append((base + a, base + b))
                unit_doc.append(doc)
            full += kept
        dropped_units = max(0, len(units) - cfg.max_cluster_units)
        if dropped_units:
            counts.stats["truncated_clusters"] += 1
            counts.stats["dropped_units"] += dropped_units
            units, unit_doc = units[:cfg.max_cluster_units], unit_doc[:cfg.max_cluster_units]
            full = full[:units[-1][1]]
        # counted over what is stored: the sentences of dropped units are not in the dataset
        sentences = [(ids[:limit], text) for ids, text, _ in full]
        truncated = sum(len(ids) > limit for ids, _, _ in full)
        words = sum(w for _, _, w in full)
        scores = None
        if summary is not None:
            texts = [" ".join(t for _, t in sentences[a:b]) for a, b in units]
            scores = rouge2_recall(texts, [t for _, t in summary], self.rouge)
            counts.stats["summary_docs"] += 1
            counts.stats["summary_sentences"] += len(summary)
        counts.stats["truncated_sentences"] += truncated
        counts.stats["units"] += len(units)
        synthetic = int(rec.synthetic or cfg.sources[si].synthetic)
        counts.stats["cluster_documents"] += len(set(unit_doc))
        counts.stats["synthetic_clusters"] += synthetic
        split = cfg.sources[si].split or rec.split or assign_split(rec.doc_id, cfg.valid_fraction, cfg.test_fraction)
        writers[split].add_document(rec.doc_id, h, order, si, [sentences], None, summary, (words, truncated, dropped),
                                    units=(units, unit_doc, scores, rec.title or ""),
                                    cluster_stats=(len(set(unit_doc)), dropped_units, synthetic))
        counts.kept[si] += 1
        n_tokens = sum(len(ids) for ids, _ in sentences)
        counts.stats["chunks"] += 1
        counts.stats["sentences"] += len(sentences)
        counts.stats["tokens"] += n_tokens
        counts.stats["words"] += words
        sc = counts.splits[split]
        sc["docs"] += 1
        sc["chunks"] += 1
        sc["sentences"] += len(sentences)
        sc["tokens"] += n_tokens

    def _write(self, si: int, rec: R.RawDoc, h: int, order: int, kept: list[tuple[list[int], str, int]],
               summary: list[tuple[list[int], str]] | None, writers: dict[str, SplitWriter], counts: Counts,
               dropped: int) -> None:
        cfg = self.cfg
        labels = None
        if summary is not None:
            # over the whole document, then cut with it into chunks
            labels = oracle_labels([t for _, t, _ in kept], [t for _, t in summary], cfg.oracle.max_sentences,
                                   cfg.oracle.method, cfg.oracle.beam_size, self.rouge).tolist()
            counts.stats["summary_docs"] += 1
            counts.stats["summary_sentences"] += len(summary)
        limit = cfg.max_sentence_tokens
        sentences = [(ids[:limit], text) for ids, text, _ in kept]
        truncated = sum(len(ids) > limit for ids, _, _ in kept)
        words = sum(w for _, _, w in kept)
        counts.stats["truncated_sentences"] += truncated
        k = cfg.max_doc_sentences
        chunks = [sentences[i:i + k] for i in range(0, len(sentences), k)]
        if len(chunks) > 1:
            counts.stats["split_documents"] += 1
            counts.stats["extra_chunks"] += len(chunks) - 1
        split = cfg.sources[si].split or rec.split or assign_split(rec.doc_id, cfg.valid_fraction, cfg.test_fraction)
        writers[split].add_document(rec.doc_id, h, order, si, chunks, labels, summary, (words, truncated, dropped))
        counts.kept[si] += 1
        n_tokens = sum(len(ids) for ids, _ in sentences)
        counts.stats["chunks"] += len(chunks)
        counts.stats["sentences"] += len(sentences)
        counts.stats["tokens"] += n_tokens
        counts.stats["words"] += words
        sc = counts.splits[split]
        sc["docs"] += 1
        sc["chunks"] += len(chunks)
        sc["sentences"] += len(sentences)
        sc["tokens"] += n_tokens

    def _finish(self, shard: int, tmp: Path, writers: dict[str, SplitWriter], counts: Counts,
                checksums: dict[str, str], timing: dict[str, float]) -> dict[str, Any]:
        name = shard_name(shard)
        for split, w in writers.items():
            w.write(tmp / split)
        for split in SPLITS:
            replace_dir(tmp / split, self.out / split / name)
        shutil.rmtree(tmp, ignore_errors=True)
        result = {"shard": shard, "plan_hash": self.plan["hash"], "tokenizer_sha256": self.sp_sha,
                  **timing, "checksums": checksums, "counts": counts.to_json(self.names)}
        write_json(shard_marker(self.out, shard), result)
        return result
