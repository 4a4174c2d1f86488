"""Bad input and merge invariants: unpaired Multi-News files, damaged gzip, JSON the parser refuses, lone
surrogates in ids and titles, synth-clusters input, duplicate ids, merging with another config, and the merged
dataset (its order, its counts) the same whatever the number of shards."""
import gzip
import json
from pathlib import Path

import pytest

from hibert.config.data import DataConfig, SourceConfig, TokenizerConfig
from hibert.data_prep import DocumentDataset, prepare, readers
from hibert.data_prep import records as R
from hibert.data_prep.merge import DuplicateIds
from hibert.data_prep.plan import PlanMismatch
from hibert.data_prep.synthetic_clusters import read_records
from hibert.errors import UserError

SENTS = ["The council met on Monday.", "It approved the budget for the schools.", "A storm hit the coast.",
         "Many homes lost power.", "Crews worked all night.", "The team won the final.", "Fans celebrated."]


@pytest.fixture(scope="module")
def tok(tiny_data) -> TokenizerConfig:
    return TokenizerConfig(model=str(tiny_data["open"] / "tokenizer.model"))


def cfg(out: Path, sources: list[SourceConfig], tok: TokenizerConfig, **kw) -> DataConfig:
    return DataConfig(sources=sources, output=str(out), tokenizer=tok, **kw)


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read(source: SourceConfig, max_chars: int = 1_000_000) -> list:
    return [r for unit, _ in readers.list_units(source) for r in readers.read(source, "s", unit, max_chars)]


def test_multinews_src_and_tgt_of_different_lengths_is_an_error_naming_both(tmp_path):
    (tmp_path / "train.src").write_text("A storm hit. ||||| Power was lost.\nThe team won.\nFans celebrated.\n")
    (tmp_path / "train.tgt").write_text("A storm cut power.\n")
    with pytest.raises(UserError, match=r"train\.src has 3 lines but .*train\.tgt has 1"):
        read(SourceConfig(format="multinews", path=str(tmp_path / "train.src")))


def test_damaged_gzip_is_an_error_naming_the_file_and_line(tmp_path):
    data = gzip.compress(b"".join(b'{"text": "Line %d is here."}\n' % i for i in range(2000)))
    (tmp_path / "trunc.jsonl.gz").write_bytes(data[:len(data) // 2])
    (tmp_path / "bad.jsonl.gz").write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    with pytest.raises(UserError, match=r"trunc\.jsonl\.gz: damaged gzip data after line [1-9]"):
        read(SourceConfig(format="jsonl", path=str(tmp_path / "trunc.jsonl.gz")))
    with pytest.raises(UserError, match=r"bad\.jsonl\.gz: damaged gzip data before its first line"):
        read(SourceConfig(format="jsonl", path=str(tmp_path / "bad.jsonl.gz")))


def test_json_the_parser_refuses_is_a_counted_skip(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "Fine."}\n' + "[" * 100_000 + "\n" + '{"text": "x", "n": ' + "9" * 5000 + "}\n")
    assert [getattr(r, "reason", "ok") for r in read(SourceConfig(format="jsonl", path=str(path)))] == [
        "ok", R.MALFORMED_JSON, R.MALFORMED_JSON]


def test_lone_surrogates_in_ids_and_titles_are_skipped_as_invalid_utf8(tmp_path):
    path = jsonl(tmp_path / "s.jsonl", [{"id": "a\udc00", "text": "Fine."},
                                        {"id": "b", "title": "T \ud800", "text": "Fine."},
                                        {"id": "c", "title": "Title", "text": "Fine."}])
    got = read(SourceConfig(format="jsonl", path=str(path), id_field="id", title_field="title", include_title=True))
    assert [(getattr(r, "reason", "ok"), r.line) for r in got] == [(R.INVALID_UTF8, 1), (R.INVALID_UTF8, 2), ("ok", 3)]
    assert got[2].paragraphs == ["Title", "Fine."]
    clusters = jsonl(tmp_path / "c.jsonl", [{"docs": ["Fine."], "s": "Ok.", "title": "\ud800"}])
    assert read(SourceConfig(format="jsonl", path=str(clusters), documents_field="docs", summary_field="s",
                             title_field="title"))[0].reason == R.INVALID_UTF8


def test_escaped_text_is_measured_after_decoding(tmp_path):
    text = ("日本語の文章です。" * 9)[:80]    # 80 characters, 480 bytes as \u escapes
    path = jsonl(tmp_path / "e.jsonl", [{"text": text}, {"text": text * 2}])
    assert [getattr(r, "reason", "ok") for r in read(SourceConfig(format="jsonl", path=str(path)), 100)] == [
        "ok", R.TOO_LONG]


def test_synth_clusters_input_with_bad_bytes_or_a_list_split_is_skipped(tmp_path):
    good = [json.dumps({"idx": i, "article": s, "highlights": s, "split": "train"}).encode()
            for i, s in enumerate(SENTS)]
    lines = [*good, b'{"idx": 9, "article": "caf\xe9", "highlights": "x"}',
             json.dumps({"idx": 10, "article": "A.", "highlights": "B.", "split": ["train"]}).encode(),
             b'{"idx": 11, "article": "A \\ud800.", "highlights": "B."}', b"[" * 100_000]
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    records, skipped, examples = read_records([str(tmp_path / "a.jsonl")], "article", "highlights", "split", "idx")
    assert len(records) == len(SENTS)
    assert skipped == {"invalid_utf8": 2, "missing_field": 1, "malformed_json": 1}
    assert examples["missing_field"] == [f"{tmp_path / 'a.jsonl'}:{len(SENTS) + 2}"]


def test_duplicate_ids_fail_the_merge_naming_both_records(tmp_path, tok):
    jsonl(tmp_path / "part_a.jsonl", [{"idx": 0, "text": SENTS[0]}, {"idx": 1, "text": SENTS[1]}])
    jsonl(tmp_path / "part_b.jsonl", [{"idx": 1, "text": SENTS[2]}])
    src = [SourceConfig(format="jsonl", path=str(tmp_path / "part_*.jsonl"), name="n", id_field="idx", split="test")]
    with pytest.raises(DuplicateIds, match=r"'n:1' is used twice in the test split: record 2 of .*part_a\.jsonl and "
                                           r"record 1 of .*part_b\.jsonl"):
        prepare(cfg(tmp_path / "out", src, tok), progress=False)


def test_merge_refuses_settings_other_than_the_shards_were_made_with(tmp_path, tok):
    src = [SourceConfig(format="jsonl", path=str(jsonl(tmp_path / "a.jsonl", [{"text": s} for s in SENTS])))]
    prepare(cfg(tmp_path / "out", src, tok, num_shards=1), shard_index=0, progress=False)
    with pytest.raises(PlanMismatch, match="changed: dedup, max_doc_sentences"):
        prepare(cfg(tmp_path / "out", src, tok, num_shards=1, max_doc_sentences=5, dedup=False), merge_only=True,
                progress=False)
    m = prepare(cfg(tmp_path / "out", src, tok, num_shards=1), merge_only=True, progress=False)
    assert m["counts"]["kept"] == 7 and m["limits"]["max_doc_sentences"] == 30


def test_merged_order_is_input_order_whatever_the_number_of_shards(tmp_path, tok):
    # 12 documents, the 3rd one long enough for 3 chunks; a cross-shard duplicate (line 10 = line 2)
    rows = [{"id": i, "text": f"Document {i} begins here. {SENTS[i % 7]}"} for i in range(12)]
    rows[2]["text"] = " ".join(SENTS)
    rows[9]["text"] = rows[1]["text"]
    src = [SourceConfig(format="jsonl", path=str(jsonl(tmp_path / "a.jsonl", rows)), name="a", id_field="id",
                        split="train")]
    got = {}
    for n in (1, 3):
        prepare(cfg(tmp_path / f"out{n}", src, tok, num_shards=n, max_doc_sentences=3), progress=False)
        ds = DocumentDataset(tmp_path / f"out{n}", "train")
        got[n] = ([ds.doc_id(i) for i in range(len(ds))], ds.doc_source.tolist())
    want = ["a:0#0", "a:1#0", "a:2#0", "a:2#1", "a:2#2", *(f"a:{i}#0" for i in (3, 4, 5, 6, 7, 8, 10, 11))]
    assert got[1] == got[3] == (want, [0, 1, 2, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10])


def test_a_duplicate_whose_first_copy_is_unusable_is_kept(tmp_path, tok):
    rows = [{"id": "a0", "text": SENTS[0], "summary": "\u200b"},   # a summary that encodes to nothing
            {"id": "a1", "text": SENTS[0], "summary": SENTS[0]}, {"id": "a2", "text": SENTS[2], "summary": SENTS[2]}]
    src = [SourceConfig(format="jsonl", path=str(jsonl(tmp_path / "a.jsonl", rows)), name="a", id_field="id",
                        summary_field="summary", split="train")]
    m = prepare(cfg(tmp_path / "out", src, tok, num_shards=1), progress=False)
    assert m["counts"]["kept"] == 2 and m["counts"]["skipped"] == {"no_sentences": 1}
    ds = DocumentDataset(tmp_path / "out", "train")
    assert [ds.source_doc(i) for i in range(len(ds))] == ["a:a1", "a:a2"]


def test_cluster_counts_are_those_of_the_kept_clusters(tmp_path, tok):
    a = {"documents": [SENTS[0], SENTS[1]], "summary": SENTS[0], "synthetic": True}
    b = {"documents": [SENTS[2], "This second document has a rather long sentence that will surely be cut short."],
         "summary": SENTS[2]}
    rows = [{"id": f"c{i}", **r} for i, r in enumerate([a, a, b])]    # c1 is a copy of c0
    src = [SourceConfig(format="jsonl", path=str(jsonl(tmp_path / "c.jsonl", rows)), name="c", id_field="id",
                        documents_field="documents", summary_field="summary", split="train")]
    keys = ("kept", "units", "cluster_documents", "synthetic_clusters", "truncated_clusters", "dropped_units",
            "sentences", "truncated_sentences")
    got = {}
    for n in (1, 2):
        m = prepare(cfg(tmp_path / f"out{n}", src, tok, num_shards=n, max_cluster_units=1, max_sentence_tokens=4),
                    progress=False)
        got[n] = {k: m["counts"][k] for k in keys}
    # every cluster keeps its first unit (one short sentence); truncation counts only what is stored
    assert got[1] == got[2] == {"kept": 2, "units": 2, "cluster_documents": 2, "synthetic_clusters": 1,
                                "truncated_clusters": 2, "dropped_units": 2, "sentences": 2,
                                "truncated_sentences": 2}


def test_a_line_over_the_limit_is_skipped_without_being_held_in_memory(tmp_path):
    """A JSONL or text file whose line never ends (a minified JSON array, a file without newlines): the reader
    keeps at most the limit of it, counts it too_long, and goes on with the next line."""
    import tracemalloc

    from hibert.data_prep.readers.jsonl import json_objects

    p = tmp_path / "x.jsonl"
    p.write_text('{"text": "a"}\n{"text": "' + "b" * 20_000_000 + '"}\n{"text": "c"}\n')
    tracemalloc.start()
    out = list(json_objects(str(p), 0, 1, max_bytes=12_000))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [o[0] if isinstance(o, tuple) else (o.reason, o.line) for o in out] == [1, ("too_long", 2), 3]
    assert peak < 4 * 2**20, peak   # the 20 MB line was never read whole


def test_a_second_prep_into_one_output_is_refused_while_the_first_writes(tmp_path, tok):
    """Two preps interleaving their writes gave a traceback or a dataset that did not verify: the output has
    one writer (the local prep or merge), one per shard for a Slurm array's tasks."""
    from filelock import FileLock

    from hibert.data_prep.pipeline import OWNER_LOCK

    src = [SourceConfig(format="jsonl", path=str(jsonl(tmp_path / "d.jsonl", [{"text": " ".join(SENTS)}])))]
    out = tmp_path / "out"
    out.mkdir()
    with FileLock(str(out / OWNER_LOCK)):
        with pytest.raises(UserError, match="another hibert prep is writing this output"):
            prepare(cfg(out, src, tok), progress=False)
        with pytest.raises(UserError, match="another hibert prep"):
            prepare(cfg(out, src, tok, num_shards=1), merge_only=True, progress=False)
        with FileLock(str(out / ".prep-shard-0.lock")):
            with pytest.raises(UserError, match="shard 0 of this output"):
                prepare(cfg(out, src, tok, num_shards=1), shard_index=0, progress=False)
    m = prepare(cfg(out, src, tok), progress=False)       # the first one done: the next one runs
    assert m["counts"]["kept"] == 1
    from hibert.data_prep.integrity import verify

    assert verify(out, m, full=True) > 0                  # and what it reports prepared verifies
