"""Source subsets and split clusters (data.sources.*: max_records, sample_fraction, split_documents): what a
label-efficiency arm or an open-domain corpus built from a multi-document one reads, and that nothing is lost
from the accounting (documents in = kept + skipped)."""
import gzip
import json

import pytest

from hibert.config import ConfigError, load_config
from hibert.config.data import DataConfig, SourceConfig
from hibert.data_prep import plan as planning
from hibert.data_prep import readers
from hibert.data_prep import records as R


def _read(source: SourceConfig, part: int = 0, parts: int = 1) -> list:
    return [r for unit, _ in readers.list_units(source)
            for r in readers.read(source, "src", unit, 1_000_000, part, parts)]


def _jsonl(path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return str(path)


def test_split_documents_gives_each_source_document_its_own_id_and_counts_empty_ones(tmp_path):
    path = _jsonl(tmp_path / "c.jsonl.gz", [
        {"id": 7, "documents": ["First doc. It has two sentences.", "Second doc."], "summary": "s"},
        {"id": 8, "documents": ["", "Only this one."]},
        {"id": 9, "documents": "not a list"}], gz=True)
    source = SourceConfig(format="jsonl", path=path, documents_field="documents", split_documents=True,
                          id_field="id")
    assert not source.is_cluster
    got = _read(source)
    docs = [r for r in got if isinstance(r, R.RawDoc)]
    skips = [(r.reason, r.line) for r in got if isinstance(r, R.Skip)]
    assert [(d.doc_id, d.paragraphs, d.summary, d.paragraph_doc) for d in docs] == [
        ("src:7/0", ["First doc. It has two sentences."], None, None), ("src:7/1", ["Second doc."], None, None),
        ("src:8/1", ["Only this one."], None, None)]
    assert skips == [(R.EMPTY, 2), (R.MISSING_FIELD, 3)]
    with pytest.raises(ValueError, match="split_documents needs documents_field"):
        SourceConfig(format="jsonl", path=path, split_documents=True)


def test_max_records_reads_only_the_first_lines_whatever_the_parts(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"text": f"Document {i}."} for i in range(10)])
    source = SourceConfig(format="jsonl", path=path, max_records=4)
    whole = [r.doc_id for r in _read(source)]
    assert whole == ["src:d:1", "src:d:2", "src:d:3", "src:d:4"]
    assert sorted(r.doc_id for p in range(3) for r in _read(source, p, 3)) == sorted(whole)
    with pytest.raises(ValueError, match="jsonl and hf sources only"):
        SourceConfig(format="text", path=path, max_records=4)


def test_sample_fraction_is_deterministic_nested_and_counted(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"idx": i, "text": f"Document {i}."} for i in range(400)])

    def drawn(fraction, parts=1, seed=0):
        source = SourceConfig(format="jsonl", path=path, id_field="idx", sample_fraction=fraction, sample_seed=seed)
        got = [r for p in range(parts) for r in _read(source, p, parts)]
        kept = {r.doc_id for r in got if isinstance(r, R.RawDoc)}
        skipped = [r for r in got if isinstance(r, R.Skip)]
        assert all(s.reason == R.NOT_SAMPLED for s in skipped) and len(kept) + len(skipped) == 400
        return kept

    small, large = drawn(0.1), drawn(0.5)
    assert small == drawn(0.1, parts=3)              # the same records whatever the sharding
    assert small < large                             # a smaller fraction's records are in a larger one's
    assert 20 <= len(small) <= 60 and 160 <= len(large) <= 240
    assert drawn(0.1, seed=1) != small               # another seed, another draw
    assert drawn(1.0) == {f"src:{i}" for i in range(400)}


def test_plans_made_before_the_subset_settings_keep_their_digest(tmp_path):
    cfg = DataConfig(sources=[SourceConfig(format="jsonl", path="x.jsonl")])
    keys = set(planning.content_settings(cfg)["sources"][0])
    assert not keys & {"split_documents", "max_records", "sample_fraction", "sample_seed"}
    sub = DataConfig(sources=[SourceConfig(format="jsonl", path="x.jsonl", sample_fraction=0.5)])
    assert planning.content_settings(sub)["sources"][0]["sample_fraction"] == 0.5   # a subset is in the plan


def test_an_override_reaches_into_a_list_of_sections():
    cfg = load_config(None, ["data=sample_cnndm", "data.sources.0.sample_fraction=0.25"])
    assert cfg.data.sources[0].sample_fraction == 0.25
    with pytest.raises(ConfigError, match="no 9"):
        load_config(None, ["data=sample_cnndm", "data.sources.9.max_records=3"])
    with pytest.raises(ConfigError, match="a list item"):
        load_config(None, ["data=sample_cnndm", "data.sources.0=3"])


def test_a_prepared_subset_records_itself_in_the_manifest(tmp_path, tiny_data):
    from hibert.config.data import TokenizerConfig
    from hibert.data_prep import prepare

    rows = [{"idx": i, "text": f"The council met on day {i}. It approved the budget."} for i in range(60)]
    path = _jsonl(tmp_path / "d.jsonl.gz", rows, gz=True)
    cfg = DataConfig(sources=[SourceConfig(format="jsonl", path=path, id_field="idx", sample_fraction=0.5)],
                     output=str(tmp_path / "out"), tokenizer=TokenizerConfig(model=str(tiny_data["open"] / "tokenizer.model")))
    m = prepare(cfg, progress=False)
    src = m["sources"][0]
    assert src["sample_fraction"] == 0.5 and src["sample_seed"] == 0
    assert src["docs_in"] == 60 and src["kept"] + src["skipped"]["not_sampled"] == 60 and 15 <= src["kept"] <= 45
