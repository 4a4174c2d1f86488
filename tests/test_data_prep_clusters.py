"""Cluster datasets: the Multi-News (.src/.tgt and JSONL), WikiSum-style and JSONL cluster readers through
`hibert prep`, units (paragraphs, windows of <= max_unit_sentences), the ranker's labels against rouge-score,
the dataset accessors, the manifest (clusters in = kept + skipped), the same clusters read plain, gzipped and
through `datasets`, synthetic clusters, and the 12 real Multi-News clusters shipped in ../shared."""
import gzip
import hashlib
import json
import math
import os
import re
from collections import Counter

import numpy as np
import pytest
from rouge_score import rouge_scorer

from conftest import REPO, SHARED, run_hibert
from hibert.data_prep import DocumentDataset
from hibert.data_prep.units import windows

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


# ---------------------------------------------------------- the same clusters: plain, gzipped, through `datasets`
@pytest.fixture(scope="module")
def three_ways(tiny_data, tmp_path_factory):
    """clusters_typed.jsonl (one type per field, so Arrow can load it) read three ways in ONE prep run: the
    plain JSONL, the same file gzipped (named .jsonl.gz; gzip is sniffed by magic number) and `format: hf`
    on the plain file (`datasets`' json builder). Dedup off: the three copies are the same clusters."""
    root = tmp_path_factory.mktemp("three_ways")
    plain = FIX / "clusters_typed.jsonl"
    gz = root / "clusters_typed.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    fields = "documents_field: documents, summary_field: summary, id_field: id, title_field: title"
    env = {**os.environ, "HF_DATASETS_CACHE": str(root / "hf_cache")}
    run_hibert(["prep", f"data.tokenizer.model={tiny_data['open'] / 'tokenizer.model'}", "data.valid_fraction=0",
                "data.test_fraction=0", "data.max_unit_sentences=2", "data.dedup=false",
                f"data.output={root / 'ds'}", "data.sources=["
                f"{{format: jsonl, path: '{plain}', name: plain, {fields}}}, "
                f"{{format: jsonl, path: '{gz}', name: gz, {fields}}}, "
                f"{{format: hf, path: '{plain}', name: hf, {fields}}}]"], env=env)
    return root / "ds", gz


def _clusters_by_source(ds) -> dict[str, dict[str, tuple]]:
    """{source name: {cluster id: everything the dataset stores about the cluster}}."""
    out: dict[str, dict[str, tuple]] = {}
    for i in range(len(ds)):
        name, _, rest = ds.doc_id(i).partition(":")
        stored = ([s.tolist() for s in ds[i]], ds.sentences_text(i), ds.summary_text(i),
                  [s.tolist() for s in ds.summary(i)], ds.unit_offsets(i).tolist(), ds.unit_docs(i).tolist(),
                  ds.unit_scores(i).tolist(), ds.title(i), ds.chunk_index(i))
        out.setdefault(name, {})[rest] = stored
    return out


def test_gzipped_and_hf_cluster_sources_prepare_the_same_clusters_as_plain_jsonl(three_ways):
    path, gz = three_ways
    m = json.loads((path / "manifest.json").read_text())
    assert m["kind"] == "clusters" and m["synthetic"] is False
    by_source = {s["name"]: s for s in m["sources"]}
    # every source: 4 clusters in, t1 and t2 kept, t3 (only empty documents) and t4 (summary null) skipped
    for name in ("plain", "gz", "hf"):
        s = by_source[name]
        assert (s["docs_in"], s["kept"], s["skipped"]) == (4, 2, {"empty": 1, "missing_field": 1}), name
    assert by_source["gz"]["files"][0]["sha256"] == hashlib.sha256(gz.read_bytes()).hexdigest()
    c = m["counts"]
    assert c["docs_in"] == m["clusters"]["clusters_in"] == 12
    assert c["kept"] == m["clusters"]["kept"] == 6 and m["clusters"]["skipped"] == 6
    assert m["clusters"]["clusters_in"] == m["clusters"]["kept"] + m["clusters"]["skipped"]
    assert c["skipped"] == {"empty": 3, "missing_field": 3}
    # per source, by hand (max_unit_sentences = 2): t1 = doc 0 [2 sentences | 1], its empty 2nd document
    # dropped, doc 1 (3 sentences) in windows [2 | 1] -> 4 units over 2 documents; t2 = doc 0 [2], doc 1
    # [1 | 1] -> 3 units over 2 documents
    assert c["units"] == 3 * (4 + 3) == m["splits"]["train"]["units"]
    assert c["cluster_documents"] == 3 * (2 + 2)
    assert c["chunks"] == 6 and c["sentences"] == 3 * (6 + 4)

    ds = DocumentDataset(path, "train")
    got = _clusters_by_source(ds)
    assert set(got) == {"plain", "gz", "hf"} and sorted(got["plain"]) == ["t1#0", "t2#0"]
    assert got["gz"] == got["plain"] and got["hf"] == got["plain"]
    ids = [ds.doc_id(i) for i in range(len(ds))]
    assert int(ds.doc_num_units.sum()) == c["units"]
    t1, t2 = ids.index("hf:t1#0"), ids.index("hf:t2#0")
    assert ds.unit_docs(t1).tolist() == [0, 0, 1, 1] and ds.unit_offsets(t1).tolist() == [0, 2, 3, 5, 6]
    assert ds.unit_docs(t2).tolist() == [0, 1, 1] and ds.unit_offsets(t2).tolist() == [0, 2, 3, 4]
    assert ds.title(t1) == "Bridge reopens" and ds.units_text(t1)[1] == ["Traffic was light in the morning."]
    assert ds.summary_text(t2) == ["A record harvest is expected and grain prices fell."]


# ---------------------------------------------------------- synthetic clusters (data_prep/synthetic_clusters.py)
SYNTH = [  # (id, split, article): storms, football, one astronomy and one market article with no related one
    ("a1", "train", "Storm hits coast, cutting power to three towns. Storm winds felled power lines along coast "
                    "roads."),
    ("a2", "train", "Coast towns clear fallen trees after storm. Rivers rose and soldiers sent boats."),
    ("a3", "train", "Power returns to towns days after storm. Crews repaired power lines near coast roads."),
    ("a4", "train", "Football club wins league final. Fans cheered their coach."),
    ("a5", "train", "Club sacks football coach after poor league season."),
    ("a6", "train", "Astronomers measured distant galaxy with new telescope."),
    ("a7", "train", "Storm hits coast, cutting power to three towns. Storm winds felled power lines along coast "
                    "roads!"),
    ("b1", "test", "Storm hits coast, cutting power to three towns. Storm winds felled power lines along coast "
                   "roads."),
    ("b2", "test", "Storm left coast towns without power for one week."),
    ("b3", "test", "Bakers sold bread and cakes at village market."),
]


def _cosines(texts: list[str]) -> np.ndarray:
    """tf-idf cosine written out: [a-z0-9]+ words of the lowercased text, 1 + log(tf), idf
    log((1 + n) / (1 + df)) + 1 over the texts given (one split), L2-normalised."""
    tfs = [Counter(re.findall(r"[a-z0-9]+", t.lower())) for t in texts]
    df = Counter(w for tf in tfs for w in tf)
    vecs = [{w: (1 + math.log(c)) * (math.log((1 + len(texts)) / (1 + df[w])) + 1) for w, c in tf.items()}
            for tf in tfs]
    norms = [math.sqrt(sum(v * v for v in x.values())) for x in vecs]
    return np.array([[sum(v * b.get(w, 0.0) for w, v in a.items()) / na / nb for b, nb in zip(vecs, norms)]
                     for a, na in zip(vecs, norms)])


def test_synthetic_clusters_group_related_articles_of_the_same_split(tmp_path):
    from hibert.data_prep.synthetic_clusters import build_clusters, main

    src = tmp_path / "articles.jsonl"
    lines = [json.dumps({"idx": i, "split": s, "article": t, "highlights": f"summary of {i}"}) for i, s, t in SYNTH]
    lines[3:3] = ["{not json", json.dumps({"idx": "x1", "split": "train", "article": "No summary here."})]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "clusters.jsonl"
    assert main(["--input", str(src), "--output", str(out), "--id-field", "idx", "--split-field", "split",
                 "--neighbours", "2", "--min-similarity", "0.1", "--max-similarity", "0.9", "--seed", "3"]) == 0
    clusters = {c["id"]: c for c in map(json.loads, out.read_text().splitlines())}
    stats = json.loads((tmp_path / "clusters.jsonl.stats.json").read_text())

    # the window by hand: a7 is a copy of a1 (cosine 1 >= 0.9: never a neighbour of a1, nor a1 of a7) and b1
    # of both, but b1 is in another split; a2 -> a3 (0.162) loses to a1 = a7 (0.164) at m = 2; a5 -> a2, a3
    # (~0.06) are below 0.1; a6 and b3 share no word with any article of their split
    want = {"a1": {"a3", "a2"}, "a2": {"a1", "a7"}, "a3": {"a1", "a7"}, "a4": {"a5"}, "a5": {"a4"},
            "a7": {"a3", "a2"}, "b1": {"b2"}, "b2": {"b1"}}
    assert {k: set(c["document_ids"]) - {k} for k, c in clusters.items()} == want
    article = {i: (s, t) for i, s, t in SYNTH}
    cos = {}
    for split in ("train", "test"):
        ids = [i for i, s, _ in SYNTH if s == split]
        m = _cosines([article[i][1] for i in ids])
        cos.update({(a, b): m[x, y] for x, a in enumerate(ids) for y, b in enumerate(ids)})
        for x, a in enumerate(ids):      # the same sets from the written-out cosines: top 2 within [0.1, 0.9)
            ok = sorted((-m[x, y], b) for y, b in enumerate(ids) if b != a and 0.1 <= m[x, y] < 0.9)
            assert {b for _, b in ok[:2]} == want.get(a, set()), a
    for k, c in clusters.items():
        split, text = article[k]
        assert c["synthetic"] is True and c["split"] == split and c["summary"] == f"summary of {k}"
        assert len(c["documents"]) == len(c["document_ids"]) == len(c["similarity"]) == 1 + len(want[k])
        assert c["document_ids"].count(k) == 1 and len(set(c["document_ids"])) == len(c["document_ids"])
        t = c["target_doc"]
        assert c["document_ids"][t] == k and c["documents"][t] == text and c["similarity"][t] == 1.0
        for j, (d, s) in enumerate(zip(c["document_ids"], c["similarity"])):
            assert c["documents"][j] == article[d][1] and article[d][0] == split   # same split only
            if j != t:
                assert 0.1 <= s < 0.9 and s == pytest.approx(cos[(k, d)], abs=1e-4)
    assert {c["target_doc"] for c in clusters.values()} != {0}     # the target is not always first

    assert stats["synthetic"] is True and "SYNTHETIC" in stats["description"]
    assert stats["records_in"] == 12 and stats["written"] == stats["clusters"] == 8
    assert stats["skipped"] == {"no_related_articles": 2, "malformed_json": 1, "missing_field": 1}
    assert stats["records_in"] == stats["written"] + sum(stats["skipped"].values())
    assert stats["skip_examples"] == {"malformed_json": [f"{src}:4"], "missing_field": [f"{src}:5"]}
    assert stats["neighbours_histogram"] == {"1": 4, "2": 4}

    # with no upper bound copies are neighbours (a1 <-> a7), but an article is still never its own neighbour
    records = [{"idx": i, "split": s, "article": t, "highlights": "x"} for i, s, t in SYNTH]
    loose, _ = build_clusters(records, "article", "highlights", "idx", "split", m=2, max_similarity=1.5)
    loose = {c["id"]: c["document_ids"] for c in loose}
    assert set(loose["a1"]) == {"a1", "a7", "a3"} and set(loose["a7"]) == {"a7", "a1", "a3"}
    assert all(ids.count(k) == 1 and len(set(ids)) == len(ids) for k, ids in loose.items())


def test_titles_are_read_as_ids_and_as_the_summarizers_first_unit(prepared):
    """JSONL `title` and WikiSum `title`: kept by prep, encoded with the dataset's own tokenizer, and — with
    `mds.title_unit` — read as unit 0 before the ranked units (not counted against the budget, one of max_units)."""
    from hibert.data_prep.tokenizer import load
    from hibert.finetune.base.clusters import RankedClusters, ranked_sentences

    ds = DocumentDataset(prepared, "train")
    ids = [ds.doc_id(i) for i in range(len(ds))]
    sp = load(ds.tokenizer_path)
    storm = ids.index("cl:c1#0")
    wiki = next(i for i, d in enumerate(ids) if d.startswith("wiki:"))
    for i in (storm, wiki):
        assert ds.title(i) and [t.tolist() for t in ds.title_ids(i)] == [sp.encode(ds.title(i), out_type=int)]
    untitled = ids.index("mn:mini:1#0")
    assert ds.title(untitled) is None and ds.title_ids(untitled) is None

    plain = RankedClusters(ds, "lead", budget=10_000)
    titled = RankedClusters(ds, "lead", budget=10_000, title_unit=True)
    k = int(np.flatnonzero(titled.rows == storm)[0])
    assert titled.titled[k] and titled.units_text(k)[0] == ["Storm hits coast"]
    assert [s.tolist() for s in titled.units(k)[0]] == [t.tolist() for t in ds.title_ids(storm)]
    as_lists = lambda units: [[s.tolist() for s in u] for u in units]  # noqa: E731
    assert as_lists(titled.units(k)[1:]) == as_lists(plain.units(k))
    n_title = len(ds.title_ids(storm)[0])
    assert titled.doc_num_tokens[k] == plain.doc_num_tokens[k] + n_title
    assert titled.doc_num_sentences[k] == plain.doc_num_sentences[k] + 1
    assert ranked_sentences(titled, k) == ranked_sentences(plain, k)   # Lead reads the title once either way
    u = int(np.flatnonzero(titled.rows == untitled)[0])
    assert not titled.titled[u] and titled.units_text(u) == plain.units_text(u)
    capped = RankedClusters(ds, "lead", budget=10_000, title_unit=True, max_units=2)
    assert len(capped.units(k)) == 2 and capped.units_text(k)[0] == ["Storm hits coast"]


@pytest.mark.timeout(60)
def test_synth_clusters_refuses_binary_missing_or_unusable_input_in_one_line(tmp_path, capsys, read_only_dir):
    """A binary file (NUL bytes, also inside a gzip file), a directory, a missing file and a file without one
    usable record: one line naming the input, exit 2, no output written (it used to print "0 clusters", exit 0).
    An output that cannot be written, or that is the input: one line naming it, exit 2. Gzip JSON Lines are
    read as they are shipped (../shared/data's .jsonl.gz)."""
    from hibert.cli import main

    good = json.dumps({"article": "Rain fell.", "highlights": "Rain."}) + "\n"
    binary = tmp_path / "articles.bin.gz"
    binary.write_bytes(gzip.compress(b"\0\1\2" * 50))
    fields = tmp_path / "other_fields.jsonl"
    fields.write_text(json.dumps({"text": "Rain fell.", "summary": "Rain."}) + "\n")
    out = tmp_path / "clusters.jsonl"
    for src, needle in [(binary, "is a binary file"), (tmp_path, "is a directory"),
                        (tmp_path / "none.jsonl", "cannot be read"), (fields, "holds no usable record")]:
        assert main(["synth-clusters", "--input", str(src), "--output", str(out)]) == 2, src
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--input {src}" in err and needle in err, err
    assert not out.exists()
    src = tmp_path / "good.jsonl"
    src.write_text(good * 3)
    assert main(["synth-clusters", "--input", str(src), "--output", str(read_only_dir / "sub" / "c.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{read_only_dir / 'sub'} is not writable" in err, err
    before = src.read_text()
    assert main(["synth-clusters", "--input", str(src), "--output", str(src)]) == 2   # it used to empty its input
    assert "would overwrite --input" in capsys.readouterr().err and src.read_text() == before
    gz = tmp_path / "articles.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps({"article": f"Rain fell on town {i}. Roads closed.",
                                                       "highlights": "Rain."}) + "\n" for i in range(6)).encode()))
    assert main(["synth-clusters", "--input", str(gz), "--output", str(out), "--min-similarity", "0"]) == 0
    assert json.loads((tmp_path / "clusters.jsonl.stats.json").read_text())["records_in"] == 6
