"""`hibert prep` end to end on the fixtures: every format, limits and chunks, manifest accounting, random
access, resume, parallel workers, bad input, tokenizer reuse and the CLI."""
import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from hibert.data_prep import DocumentDataset, prepare, readers
from hibert.data_prep import records as R
from hibert.data_prep import tokenizer as tok
from hibert.data_prep.merge import MissingShards
from hibert.data_prep.oracle import oracle_labels
from hibert.data_prep.plan import PlanMismatch
from hibert.data_prep.process import Sentencizer, shard_marker
from hibert.data_prep.shards import SPLITS, ShardPart, SplitWriter
from conftest import run_hibert
from hibert.cli import main
from hibert.config.data import DataConfig, SegmenterConfig, SourceConfig, TokenizerConfig

FIX = Path(__file__).parent / "fixtures" / "data_prep"
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
CNNDM = dict(text_field="article", summary_field="highlights", summary_sentence_sep=" . ", id_field="idx",
             ptb_tokenized=True)


def data_cfg(out: Path, sources: list[SourceConfig], **kw) -> DataConfig:
    kw.setdefault("tokenizer", TokenizerConfig(vocab_size=2000, hard_vocab_limit=False))
    return DataConfig(sources=sources, output=str(out), **kw)


def hf_dict(path: Path) -> Path:
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(line) for line in (SAMPLES / "cnndm_test_sample.jsonl").read_text().splitlines()[:6]]
    cols = lambda rs: {k: [r[k] for r in rs] for k in ("idx", "article", "highlights")}  # noqa: E731
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(cols(rows[:3])),
                          "validation": datasets.Dataset.from_dict(cols(rows[3:5])),
                          "test": datasets.Dataset.from_dict(cols(rows[5:]))}).save_to_disk(str(path))
    return path


def format_sources(tmp: Path) -> list[SourceConfig]:
    giga = tmp / "giga"
    giga.mkdir()
    (giga / "afp_eng_199405.gz").write_bytes(gzip.compress((FIX / "gigaword" / "afp_eng_199405").read_bytes()))
    return [SourceConfig(format="gigaword", path=str(giga), name="giga"),
            SourceConfig(format="cnndm", path=str(FIX / "cnndm"), name="stories"),
            SourceConfig(format="jsonl", path=str(FIX / "jsonl" / "articles.jsonl"), name="arts", text_field="body",
                         summary_field="abstract", id_field="doc_id"),
            SourceConfig(format="hf", path=str(hf_dict(tmp / "hf")), name="hf", **CNNDM),
            SourceConfig(format="text", path=str(FIX / "text"), name="notes")]


def all_chunks(out: Path) -> dict[str, tuple[str, DocumentDataset, int]]:
    found = {}
    for split in SPLITS:
        ds = DocumentDataset(out, split)
        for i in range(len(ds)):
            found[ds.doc_id(i)] = (split, ds, i)
    return found


def expected_documents(cfg: DataConfig, out: Path) -> dict[str, dict]:
    """Independently: read, segment and encode every document, apply the limits."""
    sp = tok.load(out / "tokenizer.model")
    sentencizer = Sentencizer(cfg)
    docs = {}
    for i, source in enumerate(cfg.sources):
        name = readers.source_name(source, i)
        for unit, _ in readers.list_units(source):
            for rec in readers.read(source, name, unit, cfg.max_doc_chars):
                if not isinstance(rec, R.RawDoc):
                    continue
                segmented = sentencizer.sentences([(rec.paragraphs, source.ptb_tokenized)])[0]
                sents = [(sp.encode(t), t) for t, _ in segmented]
                sents = [(ids, t) for ids, t in sents if ids]
                summ = None
                if rec.summary is not None:
                    segmented = sentencizer.sentences([(rec.summary, source.ptb_tokenized)])[0]
                    summ = [(sp.encode(t), t) for t, _ in segmented]
                docs[rec.doc_id] = {"sents": sents, "summary": summ, "split": source.split or rec.split}
    return docs


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("formats")
    cfg = data_cfg(tmp / "out", format_sources(tmp), valid_fraction=0.2, test_fraction=0.2)
    manifest = prepare(cfg, progress=False)
    return cfg, Path(cfg.output), manifest


def test_every_format_prepares_and_the_manifest_adds_up(formats):
    cfg, out, m = formats
    c = m["counts"]
    assert (c["docs_in"], c["kept"], c["skipped"]) == (20, 18, {"non_story": 2})
    assert [(s["name"], s["docs_in"], s["kept"]) for s in m["sources"]] == [
        ("giga", 5, 3), ("stories", 3, 3), ("arts", 3, 3), ("hf", 6, 6), ("notes", 3, 3)]
    for s in m["sources"]:
        assert s["docs_in"] == s["kept"] + sum(s["skipped"].values())
        assert all(len(f["sha256"]) == 64 for f in s["files"])
    assert sum(v["docs"] for v in m["splits"].values()) == c["kept"]
    assert sum(v["chunks"] for v in m["splits"].values()) == c["chunks"]
    assert sum(v["sentences"] for v in m["splits"].values()) == c["sentences"]
    assert sum(v["tokens"] for v in m["splits"].values()) == c["tokens"]
    assert m["tokenizer"]["sha256"] == tok.file_sha256(out / "tokenizer.model")
    assert m["segmenter"]["library"] == "stanza" and m["segmenter"]["variant"] == "spacy"
    assert m["segmenter"]["ptb_sources"] == ["hf"]
    assert m["limits"]["max_sentence_tokens"] == 50 and m["limits"]["max_doc_sentences"] == 30
    assert (out / "tokenizer.vocab").is_file()
    found = all_chunks(out)
    hf_splits = {k.split("#")[0]: v[0] for k, v in found.items() if k.startswith("hf:")}
    assert hf_splits == {"hf:0": "train", "hf:1": "train", "hf:2": "train", "hf:3": "valid", "hf:4": "valid",
                         "hf:5": "test"}


def test_random_access_returns_exactly_what_was_written(formats):
    cfg, out, _ = formats
    expected = expected_documents(cfg, out)
    found = all_chunks(out)
    assert {k.rsplit("#", 1)[0] for k in found} == set(expected)
    for doc_id, exp in expected.items():
        sents = exp["sents"]
        chunks = [sents[i:i + 30] for i in range(0, len(sents), 30)]
        for k, chunk in enumerate(chunks):
            split, ds, i = found[f"{doc_id}#{k}"]
            if exp["split"]:
                assert split == exp["split"]
            got = ds[i]
            assert all(a.dtype == np.int32 for a in got)
            assert [a.tolist() for a in got] == [ids[:50] for ids, _ in chunk]
            assert ds.sentences_text(i) == [t for _, t in chunk]
            assert ds.doc_num_sentences[i] == len(got) and ds.doc_num_tokens[i] == sum(map(len, got))
            assert ds.source_doc(i) == doc_id and ds.chunk_index(i) == k
            if exp["summary"] is None:
                assert ds.summary_text(i) is None and ds.summary(i) is None and ds.labels(i) is None
            else:
                assert ds.summary_text(i) == [t for _, t in exp["summary"]]
                assert [a.tolist() for a in ds.summary(i)] == [ids for ids, _ in exp["summary"]]
                want = oracle_labels([t for _, t in sents], [t for _, t in exp["summary"]])
                assert ds.labels(i).tolist() == want[30 * k:30 * k + len(chunk)].tolist()
    ds = DocumentDataset(out, "train")
    again = pickle.loads(pickle.dumps(ds))
    assert len(pickle.dumps(ds)) < 1000 and [a.tolist() for a in again[0]] == [a.tolist() for a in ds[0]]
    assert [a.tolist() for a in ds[-1]] == [a.tolist() for a in ds[len(ds) - 1]]
    with pytest.raises(IndexError):
        ds[len(ds)]
    assert ds.tokenizer_path.is_file() and ds.manifest["format_version"] == 1


def test_shard_arrays_round_trip(tmp_path, monkeypatch):
    """A writer that streams its tokens, text and their offsets to the shard directory as documents arrive
    (flushing every 5 bytes here: each int64 offset alone) writes the same bytes as one that holds everything
    until the end, and they read back."""
    from hibert.data_prep import shards

    monkeypatch.setattr(shards, "_FLUSH", 5)
    rng = np.random.default_rng(0)
    held, w = SplitWriter(), SplitWriter(directory=tmp_path / "part")
    docs = []
    for d in range(5):
        chunks = [[(rng.integers(6, 4000, rng.integers(1, 9)).tolist(), f"sentence {d}.{c}.{s} — ünïcode")
                   for s in range(rng.integers(1, 4))] for c in range(rng.integers(1, 3))]
        n = sum(len(c) for c in chunks)
        summary = [([7, 8, 9], "a summary"), ([10], "ⓢ")] if d % 2 else None
        labels = rng.integers(0, 2, n).tolist() if summary else None
        for writer in (held, w):
            writer.add_document(f"doc{d}", int(rng.integers(0, 2**63)) if writer is held else held.src_hash[-1], d, 0,
                                chunks, labels, summary)
        docs.append((chunks, labels, summary))
    w.write(tmp_path / "part")
    held.write(tmp_path / "held")
    assert {f.name: f.read_bytes() for f in (tmp_path / "part").iterdir()} == \
        {f.name: f.read_bytes() for f in (tmp_path / "held").iterdir()}
    SplitWriter().write(tmp_path / "empty")
    SplitWriter(directory=tmp_path / "empty-streamed").write(tmp_path / "empty-streamed")
    assert {f.name: f.read_bytes() for f in (tmp_path / "empty").iterdir()} == \
        {f.name: f.read_bytes() for f in (tmp_path / "empty-streamed").iterdir()}
    p = ShardPart(tmp_path / "part")
    j = 0
    for d, (chunks, labels, summary) in enumerate(docs):
        assert p.src_id(d) == f"doc{d}" and bool(p.src_has_summary[d]) == (summary is not None)
        k = 0
        for c, chunk in enumerate(chunks):
            a, b = p.chunk_sentences(j)
            assert [x.tolist() for x in p.token_arrays(a, b, p.tokens, p.sent_offsets)] == [ids for ids, _ in chunk]
            assert p._strings(p.text, p.text_offsets, a, b) == [t for _, t in chunk]
            assert (int(p.chunk_src[j]), int(p.chunk_no[j])) == (d, c)
            if labels:
                assert p.labels[a:b].tolist() == labels[k:k + len(chunk)]
            k += len(chunk)
            j += 1
    assert len(ShardPart(tmp_path / "empty").tokens) == 0


def test_limits_and_chunking(tmp_path):
    sources = [SourceConfig(format="cnndm", path=str(FIX / "cnndm")),
               SourceConfig(format="jsonl", path=str(SAMPLES / "cnndm_val_sample.jsonl"), **CNNDM)]
    cfg = data_cfg(tmp_path / "out", sources, max_sentence_tokens=6, max_doc_sentences=4, valid_fraction=0.0,
                   test_fraction=0.0)
    m = prepare(cfg, progress=False)
    ds = DocumentDataset(cfg.output, "train")
    sp = tok.load(ds.tokenizer_path)
    assert len(ds) == m["counts"]["chunks"] > m["counts"]["kept"] == 28
    truncated, by_doc = 0, {}
    for i in range(len(ds)):
        sents = ds[i]
        assert 1 <= len(sents) <= 4 and all(1 <= len(a) <= 6 for a in sents)
        full = [sp.encode(t) for t in ds.sentences_text(i)]
        assert [a.tolist() for a in sents] == [ids[:6] for ids in full]
        truncated += sum(len(ids) > 6 for ids in full)
        by_doc.setdefault(ds.source_doc(i), []).append(i)
    assert truncated == m["counts"]["truncated_sentences"] > 0
    split_docs = [v for v in by_doc.values() if len(v) > 1]
    assert len(split_docs) == m["counts"]["split_documents"] > 0
    assert sum(len(v) - 1 for v in split_docs) == m["counts"]["extra_chunks"]
    for doc, rows in by_doc.items():
        assert [ds.chunk_index(i) for i in rows] == list(range(len(rows)))
        assert len({int(ds.doc_source[i]) for i in rows}) == 1
        assert all(ds.doc_num_sentences[i] == 4 for i in rows[:-1])
        sents = [t for i in rows for t in ds.sentences_text(i)]
        labels = np.concatenate([ds.labels(i) for i in rows])
        assert labels.tolist() == oracle_labels(sents, ds.summary_text(rows[0])).tolist()  # whole-document oracle
        assert 1 <= labels.sum() <= 3


def write_bad_corpus(d: Path) -> dict[str, int]:
    """Every kind of bad input, next to good documents; returns the expected skip counts."""
    d.mkdir()
    lines = [b'{"id": "ok1", "text": "A perfectly good document. It has two sentences."}',
             b'{"id": "bad-utf8", "text": "caf\xe9 cr\xe8me"}',
             b"\x89PNG\r\x1a\x00\x00\xff\xfe\x00binary garbage\x00\x01",
             b'{"id": "ws", "text": " \\n\\t  \\n "}',
             b'{"id": "empty", "text": ""}',
             b"   ",
             b'{"id": "huge", "text": "' + b"lorem ipsum " * 900_000 + b'"}',  # a single 10 MB line
             b'{"id": "no-text", "title": "fields missing"}',
             b'{"id": "wrong-type", "text": {"nested": true}}',
             b'{"id": "truncated json", "text": "never clo',
             b'{"id": "ctrl", "text": "\\u0000\\u0001\\u0002\\u0003\\u0004 binary in json \\u0005\\u0006"}',
             b'{"id": "zero-width", "text": "\\u200b\\u200b \\u200b"}',
             b'{"id": "ok2", "text": "Another good document, kept whole."}',
             b'{"id": "dup", "text": "A perfectly good document.   It has two sentences."}']
    (d / "bad.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (d / "malformed_gigaword").write_bytes((FIX / "bad" / "malformed_gigaword").read_bytes())
    (d / "garbage.txt").write_bytes(b"Good plain text document.\n\n" + bytes(range(256)) * 4 + b"\n\n"
                                    + b"\x00\x01\x02\x03 NUL-laden but valid UTF-8 \x00\x00\n\nLast good one.\n")
    return {"invalid_utf8": 3, "binary": 2, "empty": 4, "too_long": 1, "missing_field": 2, "malformed_json": 1,
            "malformed_sgml": 5, "no_sentences": 1, "duplicate": 1}


def test_bad_input_is_skipped_with_reasons_and_nothing_is_lost(tmp_path):
    want = write_bad_corpus(tmp_path / "bad")
    sources = [SourceConfig(format="jsonl", path=str(tmp_path / "bad" / "bad.jsonl"), name="j", id_field="id"),
               SourceConfig(format="gigaword", path=str(tmp_path / "bad" / "malformed_gigaword"), name="g"),
               SourceConfig(format="text", path=str(tmp_path / "bad" / "garbage.txt"), name="t")]
    cfg = data_cfg(tmp_path / "out", sources, max_doc_chars=5_000_000, valid_fraction=0.0, test_fraction=0.0)
    m = prepare(cfg, progress=False)
    c = m["counts"]
    assert c["skipped"] == want
    assert c["docs_in"] == 14 + 7 + 4 == c["kept"] + sum(c["skipped"].values())
    ds = DocumentDataset(cfg.output, "train")
    last = (tmp_path / "bad" / "garbage.txt").read_bytes().split(b"\n").index(b"Last good one.") + 1
    assert sorted(ds.source_doc(i) for i in range(len(ds))) == ["g:NYT_ENG_20050101.0001", "j:ok1", "j:ok2",
                                                                "t:garbage:1", f"t:garbage:{last}"]
    ex = m["skip_examples"]
    assert ex["too_long"][0]["file"].endswith("bad.jsonl") and ex["too_long"][0]["line"] == 7
    assert {(Path(e["file"]).name, e["line"]) for e in ex["malformed_sgml"]} == {
        ("malformed_gigaword", n) for n in (1, 13, 22, 27, 36)}


def test_resume_skips_finished_shards(tmp_path, monkeypatch):
    sources = [SourceConfig(format="jsonl", path=str(SAMPLES / "reuters_sample.jsonl"), name="r",
                            text_field="body", id_field="newid")]
    cfg = data_cfg(tmp_path / "out", sources)
    out = Path(cfg.output)
    for i in (0, 2):  # two array tasks of three
        assert prepare(cfg, num_shards=3, shard_index=i, progress=False) is None
    with pytest.raises(MissingShards, match="1 of 3"):
        prepare(cfg, merge_only=True, progress=False)
    mtimes = {i: shard_marker(out, i).stat().st_mtime_ns for i in (0, 2)}
    prepare(cfg, num_shards=3, shard_index=1, progress=False)
    m = prepare(cfg, merge_only=True, progress=False)
    assert m["counts"]["docs_in"] == 300 and m["plan"]["num_shards"] == 3
    assert {i: shard_marker(out, i).stat().st_mtime_ns for i in (0, 2)} == mtimes
    # a dataset keeps at most OPEN_SHARDS shards' files mapped (each mapped array is an open file): same items
    from hibert.data_prep import dataset as dataset_module

    wide = DocumentDataset(out, "train")
    want = [[x.tolist() for x in wide[i]] for i in range(len(wide))]
    monkeypatch.setattr(dataset_module, "OPEN_SHARDS", 1)
    narrow = DocumentDataset(out, "train")
    assert [[x.tolist() for x in narrow[i]] for i in range(len(narrow))] == want and len(narrow._parts) == 1
    assert len({int(narrow._index[i][0]) for i in range(len(narrow))}) == 3
    # a crash in shard 1: its marker is gone (its split dirs may be there); a local rerun redoes only shard 1
    shard_marker(out, 1).unlink()
    again = prepare(cfg, progress=False)
    assert {i: shard_marker(out, i).stat().st_mtime_ns for i in (0, 2)} == mtimes
    assert again["counts"] == {**m["counts"]} and again["splits"] == m["splits"]
    # changed settings are refused unless --fresh
    with pytest.raises(PlanMismatch, match="--fresh"):
        prepare(data_cfg(out, sources, max_sentence_tokens=20), progress=False)
    fresh = prepare(data_cfg(out, sources, max_sentence_tokens=20), fresh=True, progress=False)
    assert all(shard_marker(out, i).stat().st_mtime_ns > mtimes.get(i, 0) for i in range(3))
    assert fresh["counts"]["truncated_sentences"] > m["counts"]["truncated_sentences"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_two_workers_write_the_same_dataset_as_one(tmp_path, method, monkeypatch, caplog):
    """Whichever way the workers start (fork from a single-threaded parent, else a fork server). One input file
    in 3 shards is read 3 times: prep says so."""
    from hibert.data_prep import workers

    monkeypatch.setattr(workers, "start_method", lambda cfg: method)
    sources = [SourceConfig(format="jsonl", path=str(SAMPLES / "bbc_sample.jsonl"), name="bbc", text_field="article",
                            summary_field="summary", summary_glued=True, id_field="id")]
    one = data_cfg(tmp_path / "one", sources)
    two = data_cfg(tmp_path / "two", sources, num_shards=3, workers=2)
    m1 = prepare(one, progress=False)
    assert "prep reads" not in caplog.text
    m2 = prepare(two, progress=False)
    assert "3 shards cut the input files into parts" in caplog.text and "prep reads 3.0x the input" in caplog.text
    assert (m1["plan"]["num_shards"], m2["plan"]["num_shards"]) == (1, 3)
    assert m1["counts"] == m2["counts"] and m1["tokenizer"]["sha256"] == m2["tokenizer"]["sha256"]
    assert m1["counts"]["skipped"] == {"duplicate": 1}  # the BBC corpus has exact duplicates
    for split in SPLITS:
        a, b = DocumentDataset(one.output, split), DocumentDataset(two.output, split)
        content = lambda ds: {ds.doc_id(i): ([x.tolist() for x in ds[i]], ds.labels(i).tolist(),  # noqa: E731
                                             ds.sentences_text(i)) for i in range(len(ds))}
        assert content(a) == content(b) and len(a) == m1["splits"][split]["chunks"]


def test_workers_fork_only_when_nothing_else_runs_and_no_torch_is_needed(tmp_path, monkeypatch):
    """fork from a process with no other Python thread, no torch loaded and a torch-free segmenter; else a
    fork server."""
    import sys
    import threading

    from hibert.data_prep import segment, workers

    cfg = data_cfg(tmp_path, [SourceConfig(format="text", path=str(FIX / "text"))])
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "torch", object())
    assert workers.start_method(cfg) == "forkserver"   # its OpenMP threads are invisible to `threading`
    monkeypatch.delitem(sys.modules, "torch")
    assert workers.start_method(cfg) == "fork"
    assert workers.start_method(cfg.model_copy(update={"segmenter": SegmenterConfig(kind="spacy", fast=False)})) \
        == "forkserver"   # goes through stanza.Pipeline, which imports torch
    monkeypatch.setattr(segment, "VERIFIED_STANZA_SPACY_VARIANT", set())
    assert workers.start_method(cfg) == "forkserver"
    monkeypatch.undo()
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert workers.start_method(cfg) == "forkserver"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_killed_worker_fails_the_run_instead_of_hanging(tmp_path, method):
    """The OOM killer or a signal takes a worker: the run stops at once with WorkerDied naming the unfinished
    shards (a multiprocessing.Pool would start a new worker and wait forever for the lost task)."""
    import os
    import signal

    from hibert.data_prep.workers import WorkerDied, WorkerPool

    cfg = data_cfg(tmp_path, [SourceConfig(format="text", path=str(FIX / "text"))])
    pool = WorkerPool(cfg, tmp_path, {}, 2, progress=False, method=method)
    try:
        victim = next(iter(pool.pool._processes.values()))
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        with pytest.raises(WorkerDied, match=r"shards \[0, 1\] unfinished.*rerun the same command"):
            list(pool.shards([0, 1]))
        with pytest.raises(WorkerDied, match="segmenting"):
            pool.segment([[(["One sentence."], False)]])
    finally:
        pool.terminate()


@pytest.mark.timeout(60)
def test_a_death_seen_while_submitting_is_worker_died_too(tmp_path):
    """The other side of the race above: submit() can start a replacement worker while the pool's management
    thread closes its queues, and then fails with OSError('handle is closed') instead of BrokenProcessPool."""
    from hibert.data_prep.workers import WorkerDied, WorkerPool

    class TornDown:
        def submit(self, *args, **kwargs):
            raise OSError("handle is closed")

    cfg = data_cfg(tmp_path, [SourceConfig(format="text", path=str(FIX / "text"))])
    pool = WorkerPool(cfg, tmp_path, {}, 1, progress=False, method="fork")
    real, pool.pool = pool.pool, TornDown()
    try:
        with pytest.raises(WorkerDied, match=r"shards \[0, 1\] unfinished"):
            list(pool.shards([0, 1]))
        with pytest.raises(WorkerDied, match="segmenting"):
            pool.segment([[(["One sentence."], False)]])
    finally:
        pool.pool = real
        pool.terminate()


def test_in_domain_prep_reuses_the_open_domain_tokenizer(tmp_path, repo):
    open_cfg = data_cfg(tmp_path / "open", [SourceConfig(format="text", path=str(FIX / "text"))])
    prepare(open_cfg, progress=False)
    model = tmp_path / "open" / "tokenizer.model"
    cnn = data_cfg(tmp_path / "cnn", [SourceConfig(format="cnndm", path=str(FIX / "cnndm"))],
                   tokenizer=TokenizerConfig(model=str(model)))
    m = prepare(cnn, progress=False)
    assert m["tokenizer"]["sha256"] == tok.file_sha256(model) and m["tokenizer"]["reused_from"] == str(model)
    assert (tmp_path / "cnn" / "tokenizer.model").read_bytes() == model.read_bytes()


def test_cli_prep_with_a_shipped_data_config(tmp_path, capsys, repo, monkeypatch):
    monkeypatch.chdir(repo)  # sample paths are relative to the repo root
    out = tmp_path / "cnndm"
    assert main(["prep", "data=sample_cnndm", f"data.output={out}", "--no-progress", "--workers", "1"]) == 0
    assert "250 docs in, 250 kept" in capsys.readouterr().out
    m = json.loads((out / "manifest.json").read_text())
    assert {s: v["docs"] for s, v in m["splits"].items()} == {"train": 200, "valid": 25, "test": 25}
    ds = DocumentDataset(out, "valid")
    assert ds.sentences_text(0)[0].startswith("(cnn) --") or "-lrb-" not in " ".join(ds.sentences_text(0))
    assert all(ds.labels(i).sum() >= 1 for i in range(len(ds)) if ds.chunk_index(i) == 0)
    # rerun: every shard finished, nothing redone
    marker = out / "shards" / "shard-00000.json"
    before = marker.stat().st_mtime_ns
    assert main(["prep", "data=sample_cnndm", f"data.output={out}", "--no-progress"]) == 0
    assert marker.stat().st_mtime_ns == before
    assert main(["prep", "data=sample_cnndm", f"data.output={out}", "--shard-index", "0"]) == 2
    assert "--num-shards" in capsys.readouterr().err


def test_shipped_data_configs_load(repo):
    from hibert.config import load_config

    for path in sorted((repo / "configs" / "data").glob("*.yaml")):
        cfg = load_config(None, [f"data={path.stem}"])
        assert cfg.data.sources
        if path.stem.startswith("sample_"):
            assert cfg.data.tokenizer.vocab_size <= 8000 and not cfg.data.tokenizer.hard_vocab_limit
            for s in cfg.data.sources:
                assert (repo / s.path).is_file()


@pytest.mark.timeout(60)
def test_the_tokenizer_lock_of_a_killed_task_is_free(tmp_path):
    """The tokenizer lock is an flock (filelock): while a task holds it another cannot take it; once the holder
    is killed (-9, no clean-up) the kernel has released it and the next task takes it at once — a dead array
    task never blocks the others, whatever its lock file holds."""
    import subprocess
    import sys

    from filelock import FileLock, Timeout

    from hibert.data_prep import pipeline as P

    lock = tmp_path / P.LOCK
    lock.write_text("a holder's leftovers")
    code = (f"import time\nfrom filelock import FileLock\nheld = FileLock({str(lock)!r})\nheld.acquire()\n"
            "print('held', flush=True)\ntime.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Timeout):
            FileLock(lock).acquire(timeout=0.2)
    finally:
        holder.kill()
        holder.wait(10)
    waiter = FileLock(lock)
    waiter.acquire(timeout=5)
    waiter.release()


def test_a_leftover_lock_does_not_hide_a_tokenizer_made_with_other_settings(tmp_path):
    """A dead task's lock file must not skip the settings check: the existing tokenizer stays, the run stops
    with PlanMismatch (not --fresh), and the lock it took is released."""
    from filelock import FileLock

    from hibert.data_prep import pipeline as P

    cfg = data_cfg(tmp_path, [SourceConfig(format="text", path=str(FIX / "text"))])
    (tmp_path / tok.MODEL_NAME).write_bytes(b"a tokenizer made with other settings")
    (tmp_path / P.TOKENIZER_INFO).write_text(json.dumps({
        "settings": {"vocab_size": 123}, "sha256": tok.file_sha256(tmp_path / tok.MODEL_NAME), "describe": {}}))
    (tmp_path / P.LOCK).write_text("a holder's leftovers")
    with pytest.raises(PlanMismatch, match="other settings"):
        P.ensure_tokenizer(cfg, tmp_path, {}, None, fresh=False)
    assert (tmp_path / tok.MODEL_NAME).read_bytes() == b"a tokenizer made with other settings"
    FileLock(tmp_path / P.LOCK).acquire(timeout=0)  # released


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_array_tasks_share_one_tokenizer_and_merge(tmp_path, repo):
    """Two concurrent `--shard-index` processes (a Slurm array) with no tokenizer yet: one trains it under the
    lock, the other waits for it; then `--merge`. A stale lock from a dead process does not block."""
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.lock").write_text(f"{__import__('socket').gethostname()}:999999999")  # dead holder
    args = [sys.executable, "-m", "hibert.cli", "prep", f"data.output={out}", "data.tokenizer.vocab_size=500",
            "data.tokenizer.hard_vocab_limit=false", "--num-shards", "2", "--no-progress",
            f"data.sources=[{{format: jsonl, path: '{SAMPLES / 'reuters_sample.jsonl'}', text_field: body, "
            f"id_field: newid}}]"]
    procs = [subprocess.Popen(args + ["--shard-index", str(i)], cwd=repo, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    assert sum("training SentencePiece" in log for log in logs) == 1
    merged = subprocess.run(args + ["--merge"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["docs_in"] == 300 and m["plan"]["num_shards"] == 2 and not (out / "tokenizer.lock").exists()


@pytest.mark.timeout(120)
def test_one_worker_prep_starts_no_thread_and_loads_no_torch(tmp_path):
    """The in-process path (1 worker, progress bar on) keeps the process single-threaded until spaCy is
    imported, so spaCy comes without torch (2 s per run; tqdm's monitor thread used to prevent it)."""
    import subprocess
    import sys

    sources = [SourceConfig(format="text", path=str(FIX / "text"))]
    prepare(data_cfg(tmp_path / "tok", sources, tokenizer=TokenizerConfig(vocab_size=300, hard_vocab_limit=False)),
            tokenizer_only=True, progress=False)
    code = (  # reusing a tokenizer: the first sentence is segmented inside the shard, after the bar exists
        "import sys, threading\n"
        "from hibert.data_prep import prepare\n"
        "from hibert.config.data import DataConfig, SourceConfig, TokenizerConfig\n"
        f"cfg = DataConfig(sources=[SourceConfig(format='text', path={str(FIX / 'text')!r})],"
        f" output={str(tmp_path / 'out')!r},"
        f" tokenizer=TokenizerConfig(model={str(tmp_path / 'tok' / 'tokenizer.model')!r}))\n"
        "m = prepare(cfg, progress=True)\n"
        "assert m['counts']['kept'] > 0, m['counts']\n"
        "assert 'spacy' in sys.modules and 'torch' not in sys.modules, 'torch loaded'\n"
        "assert threading.active_count() == 1, threading.enumerate()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=110,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-3000:]


def test_a_flipped_byte_or_a_truncated_file_is_found_when_the_dataset_opens(formats, tmp_path):
    """merge records every file's size and sha256; opening a split checks its own files' sizes and rehashes what
    changed since the last check, and each shard's files the first time the dataset reads that shard; `hibert
    prep --verify` rehashes everything. Each finding names the file."""
    import shutil

    from hibert.data_prep import dataset as ds_module
    from hibert.data_prep.cli import verify_dataset
    from hibert.errors import UserError

    _, out, manifest = formats
    listed = [f for f in manifest["files"] if f.startswith("train/shard-")]
    assert "tokenizer.model" in manifest["files"] and listed and all(f.endswith("/checksums.json") for f in listed)
    assert "tokens.npy" in json.loads((out / listed[0]).read_text())   # a shard's arrays: in its own table
    for damage in ("flip", "truncate", "table"):
        copy = tmp_path / damage
        shutil.copytree(out, copy)
        ds = DocumentDataset(copy, "train")       # a copy (new mtimes) is rehashed once, as it opens and is read
        assert all(len(ds[i]) for i in range(len(ds)))
        tokens = next(copy.glob("train/shard-*/tokens.npy"))
        if damage == "table":                     # the shard's checksum table itself, rewritten
            tokens = tokens.with_name("checksums.json")
            table = json.loads(tokens.read_text())
            table["tokens.npy"]["bytes"] += 1
            tokens.write_text(json.dumps(table, sort_keys=True, indent=0) + "\n")
        else:
            data = bytearray(tokens.read_bytes())
            if damage == "flip":
                data[len(data) // 2] ^= 0x10
            else:
                del data[-7:]
            tokens.write_bytes(bytes(data))
        ds_module._CHECKED.clear()                # a new process opening it
        needle = {"flip": "does not match its checksum in .*checksums.json", "truncate": "checksums.json recorded",
                  "table": "does not match its checksum in the manifest"}[damage]
        ds = DocumentDataset(copy, "train")       # opens: a shard's files are checked when it is first read
        with pytest.raises(UserError, match=needle) as e:
            for i in range(len(ds)):
                ds[i]
        assert str(tokens) in str(e.value)
        assert verify_dataset(copy) == 1
    assert verify_dataset(out) == 0


def test_a_dataset_whose_manifest_lists_every_shard_file_is_still_checked(formats, tmp_path):
    """Datasets merged before shards had their own checksums.json list every shard array in the manifest: they
    open, read, and a damaged array is still found when its shard is first read."""
    import shutil

    from hibert.data_prep import dataset as ds_module
    from hibert.errors import UserError

    _, out, _ = formats
    old = tmp_path / "old"
    shutil.copytree(out, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for rel in [f for f in manifest["files"] if f.endswith("/checksums.json")]:
        table = json.loads((old / rel).read_text())
        del manifest["files"][rel]
        (old / rel).unlink()
        manifest["files"].update({f"{rel.rsplit('/', 1)[0]}/{name}": want for name, want in table.items()})
    (old / "manifest.json").write_text(json.dumps(manifest))
    ds_module._CHECKED.clear()
    ds = DocumentDataset(old, "train")
    assert all(len(ds[i]) for i in range(len(ds)))
    tokens = next(old.glob("train/shard-*/tokens.npy"))
    tokens.write_bytes(tokens.read_bytes()[:-5])
    ds_module._CHECKED.clear()
    ds = DocumentDataset(old, "train")
    with pytest.raises(UserError, match="the manifest recorded"):
        for i in range(len(ds)):
            ds[i]


def test_a_dataset_without_checksums_warns_and_can_record_them(formats, tmp_path, caplog):
    """Datasets merged before checksums existed have no `files`: opening one says so (once) and how to add
    them; `--verify` refuses with the same advice; `--record-checksums` records the files as they are, after
    which a damaged array is found like in any dataset (and a second call changes nothing)."""
    import logging
    import shutil

    from hibert.data_prep import dataset as ds_module
    from hibert.data_prep.cli import record_checksums, verify_dataset
    from hibert.errors import UserError

    _, out, _ = formats
    old = tmp_path / "old"
    shutil.copytree(out, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["files"]
    for table in old.glob("*/shard-*/checksums.json"):
        table.unlink()
    (old / "manifest.json").write_text(json.dumps(manifest))
    ds_module._CHECKED.clear()
    with caplog.at_level(logging.WARNING, logger="hibert.data"):
        ds = DocumentDataset(old, "train")
        DocumentDataset(old, "valid")
    assert all(len(ds[i]) for i in range(len(ds)))
    said = [r.getMessage() for r in caplog.records if "records no checksums" in r.getMessage()]
    assert len(said) == 1 and "hibert prep --record-checksums data.dataset=" in said[0], said
    assert verify_dataset(old) == 2
    assert record_checksums(old) == 0
    recorded = json.loads((old / "manifest.json").read_text())
    assert recorded["files"] == manifest_files(out) and "after prep" in recorded["files_recorded"]
    assert record_checksums(old) == 0 and json.loads((old / "manifest.json").read_text()) == recorded
    assert verify_dataset(old) == 0
    tokens = next(old.glob("train/shard-*/tokens.npy"))
    data = bytearray(tokens.read_bytes())
    data[len(data) // 2] ^= 0x10
    tokens.write_bytes(bytes(data))
    assert verify_dataset(old) == 1
    ds_module._CHECKED.clear()
    ds = DocumentDataset(old, "train")
    with pytest.raises(UserError, match="does not match its checksum"):
        for i in range(len(ds)):
            ds[i]


def manifest_files(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())["files"]


def test_prep_on_a_full_disk_is_one_line_and_a_rerun_completes(tmp_path, small_disk):
    """Prep whose output fills its disk: one line naming where and the free space, exit 1, no traceback;
    with space again the same command completes and writes what a prep with space all along writes."""
    src = tmp_path / "reuters.jsonl"
    src.write_text("\n".join((SAMPLES / "reuters_sample.jsonl").read_text(encoding="utf-8").splitlines()[:120]) + "\n")
    args = lambda out: ["prep", "data.tokenizer.vocab_size=600", f"data.output={out}",  # noqa: E731
                        f"data.sources=[{{format: jsonl, path: '{src}', text_field: body, id_field: newid}}]"]
    small_disk.resize("120k")
    out = run_hibert(args(small_disk.path / "out"), check=False)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "no space left on device" in out.stderr and str(small_disk.path) in out.stderr
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    small_disk.resize("20m")
    run_hibert(args(small_disk.path / "out"))
    run_hibert(args(tmp_path / "ref"))
    got, ref = (json.loads((d / "manifest.json").read_text()) for d in (small_disk.path / "out", tmp_path / "ref"))
    assert got["counts"] == ref["counts"] and got["counts"]["docs_in"] == 120
    assert got["splits"] == ref["splits"]


def test_full_disk_is_recognised_however_it_is_raised(small_disk):
    """ENOSPC from plain writes, safetensors and torch.save (which drops the errno) — on a real full tmpfs."""
    import torch
    from safetensors.torch import save_file

    from hibert.errors import disk_full

    small_disk.resize("64k")
    big = {"w": torch.zeros(100_000)}
    with pytest.raises(OSError) as plain:
        (small_disk.path / "a.bin").write_bytes(b"\0" * 200_000)
    with pytest.raises(Exception) as st:
        save_file(big, str(small_disk.path / "b.safetensors"))
    assert disk_full(plain.value) and disk_full(st.value)
    assert not disk_full(ValueError("bad value")) and not disk_full(FileNotFoundError(2, "No such file"))


def test_a_dataset_keeps_every_shard_mapped_that_the_open_file_limit_allows(tmp_path, monkeypatch):
    """A training plan reads documents in a random order, so a dataset with more shards than it keeps mapped
    reopens one at almost every document (7.7x slower micro-batches at 240 shards): the datasets of a process
    keep as many arrays mapped as the open-file limit allows, all of them together (each mapped array holds a
    descriptor), raising the soft limit toward the hard one."""
    from hibert.data_prep import dataset as dataset_module
    from hibert.data_prep.dataset import MAX_MAPPED_ARRAYS, RESERVED_FDS, array_budget

    inf = 2**62
    assert array_budget(1024, 1024) == (1024, 1024 - RESERVED_FDS)
    assert array_budget(1024, 4096) == (4096, 4096 - RESERVED_FDS)                  # soft raised to hard
    want = RESERVED_FDS + MAX_MAPPED_ARRAYS
    assert array_budget(1024, inf) == (want, MAX_MAPPED_ARRAYS)                     # only as far as needed
    assert array_budget(inf, inf) == (inf, MAX_MAPPED_ARRAYS)
    assert array_budget(100_000, 100_000) == (100_000, MAX_MAPPED_ARRAYS)           # never lowered
    # two datasets in one process share the budget: 3 shards each, arrays for 4 shards in all
    sources = [SourceConfig(format="jsonl", path=str(SAMPLES / "reuters_sample.jsonl"), name="r",
                            text_field="body", id_field="newid")]
    cfg = data_cfg(tmp_path / "out", sources, valid_fraction=0.0, test_fraction=0.0)
    prepare(cfg, num_shards=3, progress=False)
    monkeypatch.setattr(dataset_module, "_BUDGET", 0)   # a budget below one shard's arrays: one shard each
    a, b = DocumentDataset(cfg.output, "train"), DocumentDataset(cfg.output, "train")
    want_items = [[x.tolist() for x in a[i]] for i in range(len(a))]
    for i in range(len(b)):
        b[i]
    assert len(a._parts) == 1 and len(b._parts) == 1
    per = a._per_shard
    monkeypatch.setattr(dataset_module, "_BUDGET", 4 * per)
    for i in range(len(a)):
        a[i]
    for i in range(len(b)):
        b[i]
    assert len(a._parts) + len(b._parts) <= 4 and dataset_module.mapped_estimate() <= 4 * per
    assert [[x.tolist() for x in a[i]] for i in range(len(a))] == want_items


@pytest.mark.timeout(120)
def test_staging_left_by_a_dead_process_is_cleared_and_a_finished_prep_leaves_none(tmp_path):
    """A shard's staging (`.tmp/shard-NNNNN.<pid>`) left by a process that died (kill -9, a full disk): the next
    process to work on that shard removes it (not a live process's), the merge removes whatever is left, and a
    prep that fails on a shard gives its staging back at once."""
    import os
    import subprocess
    import sys

    from hibert.data_prep import process

    src = tmp_path / "reuters.jsonl"
    src.write_text("\n".join((SAMPLES / "reuters_sample.jsonl").read_text(encoding="utf-8").splitlines()[:40]) + "\n")
    cfg = data_cfg(tmp_path / "out", [SourceConfig(format="jsonl", path=str(src), text_field="body", id_field="newid")],
                   tokenizer=TokenizerConfig(vocab_size=300, hard_vocab_limit=False))
    out = Path(cfg.output)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    staged = {name: out / ".tmp" / name for name in
              (f"shard-00000.{dead.pid}", f"shard-00001.{dead.pid}", f"shard-00001.{os.getppid()}")}
    for d in staged.values():
        (d / "train").mkdir(parents=True)
        (d / "train" / "tokens.bin").write_bytes(b"\0" * 1000)
    assert prepare(cfg, num_shards=2, shard_index=1, progress=False) is None   # an array task: shard 1
    assert {n for n, d in staged.items() if d.exists()} == {f"shard-00000.{dead.pid}", f"shard-00001.{os.getppid()}"}
    assert prepare(cfg, num_shards=2, shard_index=0, progress=False) is None
    assert [p.name for p in (out / ".tmp").iterdir()] == [f"shard-00001.{os.getppid()}"]   # a live process's
    prepare(cfg, merge_only=True, progress=False)
    assert not (out / ".tmp").exists()
    # a shard that fails (here: a full disk as the split is written) leaves no staging behind
    shard_marker(out, 0).unlink()

    def full(self: object, directory: Path) -> None:
        raise OSError(28, "No space left on device")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(process.SplitWriter, "write", full)
        with pytest.raises(OSError, match="No space left"):
            prepare(cfg, progress=False)
    assert list((out / ".tmp").iterdir()) == []
    prepare(cfg, progress=False)
    assert not (out / ".tmp").exists()


@pytest.mark.timeout(60)
def test_prep_into_a_directory_it_cannot_write_is_one_line(tmp_path, read_only_dir, capsys):
    """A read-only data.output (or one under a read-only directory): one line naming it, exit 2, before any work."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "One sentence here. Another one there."}) + "\n")
    for out in (read_only_dir, read_only_dir / "sub"):
        code = main(["prep", f"data.output={out}", f"data.sources=[{{format: jsonl, path: '{src}'}}]", "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"data.output {out} is not writable" in err and "Traceback" not in err, err
