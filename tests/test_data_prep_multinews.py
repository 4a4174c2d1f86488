"""Multi-News clusters in the shared release's layout (split, id, documents, summary, relevant) through the JSONL
cluster reader and `hibert prep`: each document of a record stays a document of the cluster (its units carry its
index), and `relevant_field` (Multi-News+'s cleansing) keeps only the listed documents — the dropped ones
counted per source, a malformed list or an empty one a counted skip, clusters in = kept + skipped."""
import gzip
import json

import pytest

from conftest import REPO, SHARED
from hibert.config.data import DataConfig, SourceConfig, TokenizerConfig
from hibert.data_prep import DocumentDataset, prepare
from hibert.data_prep import plan as planning
from hibert.data_prep import readers
from hibert.data_prep import records as R

FIXTURE = REPO / "tests" / "fixtures" / "multidoc" / "multinews_plus.jsonl"
FIELDS = {"documents_field": "documents", "summary_field": "summary", "id_field": "id"}


def _read(source: SourceConfig) -> list:
    return [r for unit, _ in readers.list_units(source) for r in readers.read(source, "mn", unit, 1_000_000)]


def _gz(tmp_path):
    path = tmp_path / "multinews_test.jsonl.gz"
    path.write_bytes(gzip.compress(FIXTURE.read_bytes()))
    return str(path)


def test_the_reader_keeps_document_boundaries_and_filters_by_relevant(tmp_path):
    path = _gz(tmp_path)
    plain = _read(SourceConfig(format="jsonl", path=path, **FIELDS))
    assert all(isinstance(r, R.RawDoc) and r.not_relevant == 0 for r in plain)   # `relevant` unread without the option
    assert [r.paragraph_doc for r in plain] == [[0, 1, 2], [0, 1], [0, 1], [0, 1], [0, 1], [0, 1, 2]]

    got = _read(SourceConfig(format="jsonl", path=path, relevant_field="relevant", **FIELDS))
    kept = {r.doc_id: r for r in got if isinstance(r, R.RawDoc)}
    skips = [(r.reason, r.line, r.not_relevant) for r in got if isinstance(r, R.Skip)]
    assert sorted(kept) == ["mn:101", "mn:102", "mn:106"]
    # 101: documents 0 and 2 (renumbered 0, 1); 102: [1, 0] keeps both, in document order; 106: document 2 alone
    assert kept["mn:101"].paragraphs[1].startswith("Engineers") and kept["mn:101"].paragraph_doc == [0, 1]
    assert kept["mn:102"].paragraphs[0].startswith("The city council") and kept["mn:102"].paragraph_doc == [0, 1]
    assert kept["mn:106"].paragraphs == [json.loads(FIXTURE.read_text().splitlines()[5])["documents"][2]]
    assert [kept[k].not_relevant for k in ("mn:101", "mn:102", "mn:106")] == [1, 0, 2]
    # 103 lists none (its 2 documents dropped); 104's index 5 and 105's string are malformed (nothing filtered)
    assert skips == [(R.NO_RELEVANT, 3, 2), (R.MALFORMED_RELEVANT, 4, 0), (R.MALFORMED_RELEVANT, 5, 0)]
    detail = {r.line: r.detail for r in got if isinstance(r, R.Skip)}
    assert "5" in detail[4] and "2 documents" in detail[4] and "str" in detail[5]


def test_relevant_field_is_refused_where_it_would_filter_nothing(tmp_path):
    for bad in ({"format": "jsonl", "path": "x.jsonl", "relevant_field": "relevant"},             # no documents
                {"format": "multinews", "path": "x.src", "relevant_field": "relevant", "documents_field": "d"},
                {"format": "jsonl", "path": "x.jsonl", "relevant_field": "relevant", "documents_field": "d",
                 "split_documents": True}):
        with pytest.raises(ValueError, match="relevant_field filters the documents"):
            SourceConfig(**bad)


def test_plans_made_before_relevant_field_keep_their_digest():
    cfg = DataConfig(sources=[SourceConfig(format="jsonl", path="x.jsonl", **FIELDS)])
    assert "relevant_field" not in planning.content_settings(cfg)["sources"][0]
    rel = DataConfig(sources=[SourceConfig(format="jsonl", path="x.jsonl", relevant_field="relevant", **FIELDS)])
    assert planning.content_settings(rel)["sources"][0]["relevant_field"] == "relevant"


@pytest.fixture(scope="module")
def prepared(tiny_data, tmp_path_factory):
    """The fixture prepared twice in one run: as released (`all`) and with the relevant filter (`rel`), both
    forced to test, windows of <= 2 sentences; dedup off (fully relevant clusters are the same in both)."""
    root = tmp_path_factory.mktemp("multinews")
    path = _gz(root)
    cfg = DataConfig(sources=[SourceConfig(format="jsonl", path=path, name="all", split="test", **FIELDS),
                              SourceConfig(format="jsonl", path=path, name="rel", split="test",
                                           relevant_field="relevant", **FIELDS)],
                     output=str(root / "out"), dedup=False, max_unit_sentences=2,
                     tokenizer=TokenizerConfig(model=str(tiny_data["open"] / "tokenizer.model")))
    return prepare(cfg, progress=False), root / "out"


def test_the_manifest_counts_the_filter_and_every_cluster(prepared):
    m, _ = prepared
    src = {s["name"]: s for s in m["sources"]}
    assert "relevant_field" not in src["all"] and (src["all"]["docs_in"], src["all"]["kept"]) == (6, 6)
    rel = src["rel"]
    assert rel["relevant_field"] == "relevant" and rel["documents_not_relevant"] == 1 + 0 + 2 + 2
    assert (rel["docs_in"], rel["kept"]) == (6, 3)
    assert rel["skipped"] == {"malformed_relevant": 2, "no_relevant_documents": 1}
    assert m["clusters"]["documents_not_relevant"] == 5 and "relevant_field" in m["clusters"]["relevant_filter"]
    c = m["counts"]
    assert c["docs_in"] == 12 == c["kept"] + sum(c["skipped"].values())
    # documents with units: all 3 + 2 + 2 + 2 + 2 + 3; filtered 2 + 2 + 1
    assert c["cluster_documents"] == 14 + 5
    assert {ex["line"] for ex in m["skip_examples"]["malformed_relevant"]} == {4, 5}


def test_prepared_units_keep_each_kept_document_apart(prepared):
    _, out = prepared
    ds = DocumentDataset(out, "test")
    at = {ds.doc_id(i): i for i in range(len(ds))}
    dam_all, dam_rel = at["all:101#0"], at["rel:101#0"]
    # document 0: 3 sentences -> windows [2 | 1]; the singer's lunch (document 1) dropped by the filter
    assert ds.unit_docs(dam_all).tolist() == [0, 0, 1, 2] and ds.unit_docs(dam_rel).tolist() == [0, 0, 1]
    assert ds.units_text(dam_rel)[2] == ["Engineers said the dam held.", "Officials will inspect it again on Friday."]
    assert not any("singer" in s for s in ds.sentences_text(dam_rel))
    bridge = at["rel:106#0"]
    assert ds.unit_docs(bridge).tolist() == [0, 0]
    assert ds.sentences_text(bridge)[0] == "The bridge reopened after repairs."
    assert ds.summary_text(bridge) == ["The bridge reopened after repairs and traffic was light."]
    assert sorted(k for k in at if k.startswith("rel:")) == ["rel:101#0", "rel:102#0", "rel:106#0"]


MULTINEWS_TEST = SHARED / "data" / "multidoc" / "multinews_test.jsonl.gz"


@pytest.mark.skipif(not MULTINEWS_TEST.is_file(), reason="needs ../shared")
def test_the_real_test_split_reads_with_its_boundaries_and_filter():
    records = [json.loads(line) for line in gzip.open(MULTINEWS_TEST, "rt", encoding="utf-8")]
    plain = _read(SourceConfig(format="jsonl", path=str(MULTINEWS_TEST), **FIELDS))
    assert len(plain) == len(records) == 4622 and all(isinstance(r, R.RawDoc) for r in plain)
    # every document of the release is one non-empty paragraph: the units' documents are the records' documents
    assert all(r.paragraph_doc == list(range(len(x["documents"]))) for r, x in zip(plain, records))
    got = _read(SourceConfig(format="jsonl", path=str(MULTINEWS_TEST), relevant_field="relevant", **FIELDS))
    assert sum(r.not_relevant for r in got) == sum(len(x["documents"]) - len(x["relevant"]) for x in records)
    kept = [r for r in got if isinstance(r, R.RawDoc)]
    assert len(kept) == sum(bool(x["relevant"]) for x in records)
    assert all(r.reason == R.NO_RELEVANT for r in got if isinstance(r, R.Skip))
