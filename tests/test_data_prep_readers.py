"""Readers on fixtures in each input format, the summary shapes, PTB handling and record partitioning."""
import gzip
import json
import shutil
from pathlib import Path

import pytest

from hibert.data_prep import readers
from hibert.data_prep import records as R
from hibert.data_prep.ptb import detokenize, split_sentences
from hibert.data_prep.summaries import split_glued
from hibert.config.data import SourceConfig

FIX = Path(__file__).parent / "fixtures" / "data_prep"


def _read(source: SourceConfig, part: int = 0, parts: int = 1) -> list:
    out = []
    for unit, _ in readers.list_units(source):
        out += list(readers.read(source, "src", unit, 1_000_000, part, parts))
    return out


@pytest.mark.parametrize("gz", [False, True])
def test_gigaword_ldc_sgml(tmp_path, gz):
    src = FIX / "gigaword" / "afp_eng_199405"
    path = tmp_path / ("afp_eng_199405.gz" if gz else "afp_eng_199405")
    if gz:
        path.write_bytes(gzip.compress(src.read_bytes()))
    else:
        shutil.copy(src, path)
    recs = _read(SourceConfig(format="gigaword", path=str(path), include_title=True))
    docs = [r for r in recs if isinstance(r, R.RawDoc)]
    skips = [r for r in recs if isinstance(r, R.Skip)]
    assert [d.doc_id for d in docs] == ["src:AFP_ENG_19940512.0001", "src:AFP_ENG_19940512.0003",
                                        "src:AFP_ENG_19940512.0004"]
    assert [(s.reason, s.line) for s in skips] == [("non_story", 26), ("non_story", 68)]
    first = docs[0]
    assert first.paragraphs[0] == "Harbour authority approves new container terminal"  # the HEADLINE
    assert len(first.paragraphs) == 4 and first.paragraphs[1].startswith("The harbour authority on Thursday")
    assert "\n" not in first.paragraphs[1] and first.paragraphs[1].endswith("by the end of the decade.")
    assert first.summary is None and first.line == 1
    assert "Alpha Systems & Co." in docs[2].paragraphs[1] and "<mostly engineers>" in docs[2].paragraphs[2]
    every = _read(SourceConfig(format="gigaword", path=str(path), story_only=False))
    assert len(every) == 5 and all(isinstance(r, R.RawDoc) for r in every)
    assert every[0].paragraphs[0].startswith("The harbour")  # no headline unless include_title


def test_gigaword_malformed_sgml(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes((FIX / "bad" / "malformed_gigaword").read_bytes()
                     + b'<DOC id="X.7" type="story" >\n<TEXT>\n<P>\ncaf\xe9 au lait\n</P>\n</TEXT>\n</DOC>\n')
    recs = _read(SourceConfig(format="gigaword", path=str(path)))
    assert [(type(r).__name__, getattr(r, "reason", None)) for r in recs] == [
        ("Skip", "malformed_sgml"), ("RawDoc", None), ("Skip", "malformed_sgml"), ("Skip", "malformed_sgml"),
        ("Skip", "malformed_sgml"), ("Skip", "malformed_sgml"), ("Skip", "empty"), ("Skip", "invalid_utf8")]
    assert recs[0].line == 1 and recs[2].line == 13 and recs[2].detail == "<DOC> without </DOC>"


def test_cnndm_story_files():
    recs = _read(SourceConfig(format="cnndm", path=str(FIX / "cnndm")))
    assert [r.doc_id for r in recs] == ["src:0a1b2c3d4e5f", "src:1f2e3d4c5b6a", "src:9e8d7c6b5a4f"]
    first = recs[0]
    assert first.summary == ["Town votes to keep its Victorian railway station open",
                             "Campaign lasted three years and collected more than 5,000 signatures",
                             "Trains will continue to stop twice an hour"]
    assert len(first.paragraphs) == 4 and not any("@highlight" in p for p in first.paragraphs)
    assert [len(r.summary) for r in recs] == [3, 2, 1]


def test_cnndm_story_without_highlights_is_skipped(tmp_path):
    (tmp_path / "a.story").write_text("Just an article, no highlights.\n")
    (tmp_path / "b.story").write_text("@highlight\n\nonly a highlight\n")
    recs = _read(SourceConfig(format="cnndm", path=str(tmp_path)))
    assert [(r.reason, Path(r.file).name) for r in recs] == [("missing_field", "a.story"), ("empty", "b.story")]


def test_jsonl_configurable_fields():
    src = SourceConfig(format="jsonl", path=str(FIX / "jsonl" / "articles.jsonl"), text_field="body",
                       summary_field="abstract", id_field="doc_id", title_field="headline", include_title=True)
    recs = _read(src)
    assert [r.doc_id for r in recs] == ["src:a1", "src:a2", "src:a3"]
    assert recs[0].paragraphs == ["Library extends opening hours",
                                  "The central library will open until ten in the evening from next month. "
                                  "The change follows a survey of readers.",
                                  "Librarians said demand was highest during exam periods."]
    assert recs[0].summary == ["Library opens until 10pm from next month."]
    assert recs[2].paragraphs[1:] == ["A private collector has donated twelve paintings to the city museum.",
                                      "The works will be shown in a new gallery opening in the spring. "
                                      "The museum's director called the gift remarkable."]
    assert recs[2].summary == ["Collector donates twelve paintings to museum.", "New gallery opens in spring."]
    plain = _read(SourceConfig(format="jsonl", path=str(FIX / "jsonl" / "articles.jsonl"), text_field="body"))
    assert [r.doc_id for r in plain] == ["src:articles:1", "src:articles:2", "src:articles:3"]
    assert plain[0].summary is None and plain[0].paragraphs[0].startswith("The central library")


def test_hf_dataset_saved_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(line) for line in (FIX / "jsonl" / "articles.jsonl").read_text().splitlines()]
    rows = [{"id": r["doc_id"], "text": r["body"] if isinstance(r["body"], str) else "\n\n".join(r["body"]),
             "summary": r["abstract"] if isinstance(r["abstract"], str) else " ".join(r["abstract"])} for r in rows]
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    datasets.Dataset.from_dict(cols).save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({k: v[:2] for k, v in cols.items()}),
                          "validation": datasets.Dataset.from_dict({k: v[2:] for k, v in cols.items()})}
                         ).save_to_disk(str(tmp_path / "dict"))
    single = _read(SourceConfig(format="hf", path=str(tmp_path / "single"), summary_field="summary", id_field="id"))
    assert [r.doc_id for r in single] == ["src:a1", "src:a2", "src:a3"] and all(r.split is None for r in single)
    assert single[1].summary == ["Bridge repairs finished two weeks early. The bridge reopened on Friday."]
    src = SourceConfig(format="hf", path=str(tmp_path / "dict"))
    units = [u for u, _ in readers.list_units(src)]
    assert units == [f"{tmp_path / 'dict'}::train", f"{tmp_path / 'dict'}::validation"]
    both = _read(src)
    assert [(r.doc_id, r.split) for r in both] == [("src:train:0", "train"), ("src:train:1", "train"),
                                                   ("src:validation:0", "valid")]
    only = _read(SourceConfig(format="hf", path=str(tmp_path / "dict"), hf_split="validation"))
    assert len(only) == 1
    assert readers.checksum(src, units[0]) != readers.checksum(src, units[1])


def test_hf_local_data_files_through_datasets(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    src = SourceConfig(format="hf", path=str(FIX / "jsonl" / "articles.jsonl"), text_field="body",
                       summary_field="abstract", id_field="doc_id")
    recs = _read(src)
    assert [r.doc_id for r in recs] == ["src:a1", "src:a2", "src:a3"]
    assert recs[2].summary == ["Collector donates twelve paintings to museum.", "New gallery opens in spring."]


def test_plain_text_blank_line_separated():
    recs = _read(SourceConfig(format="text", path=str(FIX / "text")))
    assert [(r.doc_id, r.line) for r in recs] == [("src:notes:1", 1), ("src:notes:4", 4), ("src:notes:8", 8)]
    assert recs[1].paragraphs == ["The second document describes a meeting. The committee met on Tuesday. "
                                  "It agreed to publish its report next week."]


@pytest.mark.parametrize("fmt,path", [("gigaword", "gigaword"), ("jsonl", "jsonl/articles.jsonl"),
                                      ("text", "text"), ("cnndm", "cnndm")])
def test_parts_partition_the_records(fmt, path):
    src = SourceConfig(format=fmt, path=str(FIX / path), text_field="body" if fmt == "jsonl" else "text",
                       story_only=False)
    whole = [(type(r).__name__, r.line, getattr(r, "doc_id", None)) for r in _read(src)]
    parts = [[(type(r).__name__, r.line, getattr(r, "doc_id", None)) for r in _read(src, k, 2)] for k in range(2)]
    assert sorted(parts[0] + parts[1]) == sorted(whole) and not set(parts[0]) & set(parts[1])


def test_glued_summary_is_split_using_the_article():
    article = ("TimeWarner said sales rose 2% to $11.1bn.\n\nThe U.S.-led group grew 3.5% in 2003. "
               'Its boss said: "We are pleased."\n\nProfits rose 1.3%\n\nRevenue fell in Europe.')
    glued = ('TimeWarner said sales rose 2% to $11.1bn.Its boss said: "We are pleased."Profits rose 1.3%'
             "Revenue fell in Europe.")
    assert split_glued(glued, article) == ["TimeWarner said sales rose 2% to $11.1bn.",
                                           'Its boss said: "We are pleased."', "Profits rose 1.3%",
                                           "Revenue fell in Europe."]
    assert split_glued("The U.S.-led group grew 3.5% in 2003.", article) == ["The U.S.-led group grew 3.5% in 2003."]


def test_glued_summaries_of_the_bbc_sample_come_from_the_article(repo):
    rows = [json.loads(line) for line in (repo / "samples" / "bbc_sample.jsonl").read_text().splitlines()]
    pieces = [(p, " " + " ".join(r["article"].split()) + " ")
              for r in rows for p in split_glued(r["summary"], r["article"])]
    found = sum(f" {p} " in art for p, art in pieces)
    assert found / len(pieces) > 0.99 and len(pieces) > 5 * len(rows)


def test_ptb_sentences_and_detokenization():
    text = ("paris , france -- world no. 5 andy roddick lost . `` i could n't win , '' he said . "
            "the u.s. team -lrb- led by smith -rrb- won $ 5 million ! `` yes ! '' fans shouted")
    sents = split_sentences(text)
    assert [len(s) for s in sents] == [11, 10, 13, 4, 2]
    assert [detokenize(s) for s in sents] == [
        "paris, france -- world no. 5 andy roddick lost.", "\"i couldn't win,\" he said.",
        "the u.s. team (led by smith) won $5 million!", '"yes!"', "fans shouted"]


def test_bad_records_in_jsonl(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [b'{"text": "fine document."}', b'{"text": "caf\xe9"}', b"\x89PNG\r\x1a\x00\x00\xff\xfe",
             b'{"text": "   \\n\\t  "}', b"", b'{"text": "' + b"word " * 2_100_000 + b'"}', b'{"title": "no text"}',
             b'{"text": 42}', b'{"text": "unterminated', b"[1, 2]", b'{"text": "\\u0000\\u0001\\u0002\\u0003 x"}',
             b'{"text": "lone \\ud800 surrogate"}']
    path.write_bytes(b"\n".join(lines) + b"\n")
    recs = _read(SourceConfig(format="jsonl", path=str(path)))
    assert [getattr(r, "reason", "ok") for r in recs] == [
        "ok", "invalid_utf8", "invalid_utf8", "empty", "empty", "too_long", "missing_field", "missing_field",
        "malformed_json", "malformed_json", "binary", "invalid_utf8"]
    assert [r.line for r in recs] == list(range(1, 13))
