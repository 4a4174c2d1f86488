"""Cluster datasets: the Multi-News (.src/.tgt and JSONL), WikiSum-style and JSONL cluster readers through
`hibert prep`, units (paragraphs, windows of <= max_unit_sentences), the ranker's labels against rouge-score,
the dataset accessors, the manifest (clusters in = kept + skipped), synthetic clusters, and the 12 real
Multi-News clusters shipped in ../shared."""
import json

import numpy as np
import pytest
from rouge_score import rouge_scorer

from conftest import REPO, SHARED, run_hibert
from data_prep import DocumentDataset
from data_prep.units import windows

FIX = REPO / "tests" / "fixtures" / "multidoc"


@pytest.fixture(scope="module")
def prepared(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("clusters")
    tok = tiny_data["open"] / "tokenizer.model"
    common = [f"data.tokenizer.model={tok}", "data.valid_fraction=0", "data.test_fraction=0",
              "data.max_unit_sentences=2"]
    run_hibert(["prep", *common, f"data.output={root / 'mixed'}", "data.sources=["
                f"{{format: multinews, path: '{FIX / 'mini.src'}', name: mn}}, "
                f"{{format: multinews, path: '{FIX / 'multinews_hf.jsonl'}', name: mnhf}}, "
                f"{{format: jsonl, path: '{FIX / 'clusters.jsonl'}', name: cl, documents_field: documents, "
                f"summary_field: summary, id_field: id, title_field: title}}, "
                f"{{format: jsonl, path: '{FIX / 'wikisum.jsonl'}', name: wiki, documents_field: paragraphs, "
                f"summary_field: target, title_field: title}}]"])
    return root / "mixed"


def test_readers_count_every_cluster_and_name_the_bad_ones(prepared):
    m = json.loads((prepared / "manifest.json").read_text())
    assert m["kind"] == "clusters" and m["synthetic"] is False
    c = m["counts"]
    assert c["docs_in"] == 3 + 3 + 4 + 1 == m["clusters"]["clusters_in"]
    assert c["docs_in"] == c["kept"] + sum(c["skipped"].values())
    assert c["kept"] == 2 + 1 + 1 + 1
    by_source = {s["name"]: s for s in m["sources"]}
    assert by_source["mn"]["skipped"] == {"empty": 1}                      # ' ||||| ': no text at all
    assert by_source["mnhf"]["skipped"] == {"malformed_json": 1, "missing_field": 1}
    assert by_source["cl"]["skipped"] == {"binary": 1, "empty": 1, "missing_field": 1}
    assert all(ex["file"] and ex["line"] for exs in m["skip_examples"].values() for ex in exs)


def test_units_documents_titles_and_ranker_labels(prepared):
    ds = DocumentDataset(prepared, "train")
    ids = [ds.doc_id(i) for i in range(len(ds))]
    scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)
    checked = 0
    for i in range(len(ds)):
        o, docs, scores = ds.unit_offsets(i), ds.unit_docs(i), ds.unit_scores(i)
        assert o[0] == 0 and o[-1] == len(ds[i]) and len(docs) == len(scores) == len(o) - 1 == ds.doc_num_units[i]
        assert (np.diff(o) <= 2).all() and (np.diff(o) >= 1).all()           # windows of <= max_unit_sentences
        assert (np.diff(docs) >= 0).all()                                     # document order
        summary = " ".join(ds.summary_text(i))
        for text, score in zip(ds.units_text(i), scores):
            assert score == pytest.approx(scorer.score(summary, " ".join(text))["rouge2"].recall, abs=1e-6)
            checked += 1
    assert checked >= 10
    storm = ids.index("cl:c1#0")
    assert ds.title(storm) == "Storm hits coast"
    assert ds.unit_docs(storm).tolist() == [0, 0, 1, 1]   # 2 + 1 sentences in doc 0 (2 paragraphs), 3 in doc 1
    council = ds.units_text(ids.index("mn:mini:1#0"))
    assert council[0] == ["The council met on Monday ."] and ds.unit_docs(ids.index("mn:mini:1#0")).tolist() == [0, 0, 1, 1]
    assert windows(5, 2) == [(0, 2), (2, 4), (4, 5)]


def test_a_data_config_may_not_mix_clusters_and_documents(tmp_path):
    out = run_hibert(["prep", f"data.output={tmp_path}", "data.sources=[{format: jsonl, path: a.jsonl}, "
                      "{format: multinews, path: b.src}]", "--print-config"], check=False)
    assert out.returncode == 2 and "mix clusters and documents" in out.stderr


@pytest.mark.skipif(not (SHARED / "data" / "multidoc" / "multinews_12.jsonl").is_file(), reason="needs ../shared")
def test_the_real_multinews_clusters_prepare(tiny_data, tmp_path):
    run_hibert(["prep", "data=multinews_12", f"data.output={tmp_path / 'mn'}",
                f"data.tokenizer.model={tiny_data['open'] / 'tokenizer.model'}"])
    m = json.loads((tmp_path / "mn" / "manifest.json").read_text())
    assert m["counts"]["docs_in"] == 12 and m["counts"]["kept"] == 11 and m["counts"]["skipped"] == {"duplicate": 1}
    ds = DocumentDataset(tmp_path / "mn", "test")
    assert len(ds) == 11 and m["synthetic"] is False and all(ds.unit_scores(i) is not None for i in range(11))
