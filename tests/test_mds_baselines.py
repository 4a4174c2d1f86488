"""The Multi-News extractive baselines (finetune/evaluation/mds_baselines.py) on hand-made clusters: First-k by
hand, the word budget, the oracle against the naive rouge-score greedy of data_prep/oracle_reference.py, LexRank
against the `lexrank` package's own summaries, the centroid's redundancy filter, and the report that `hibert
compare --results` turns into a results file docs/tables.py renders."""
import importlib.util
import json
import sys

import pytest

from conftest import REPO
from hibert.data_prep.oracle_reference import greedy_rouge_score
from hibert.finetune.evaluation import mds_baselines as B

FIXTURE = REPO / "tests" / "fixtures" / "multidoc" / "multinews_plus.jsonl"

STORM = B.Cluster("h:storm#0", [
    "A storm hit the northern coast on Monday.", "Power lines fell in three towns.", "Schools stayed closed.",
    "The storm cut power to thousands of homes on the coast.", "Crews worked through the night.",
    "Officials said power would return by Friday.", "The storm was the worst in a decade."],
    [0, 0, 0, 1, 1, 2, 2],
    ["A storm hit the coast and cut power to thousands of homes.", "Officials expect power back by Friday."])
BUDGET = B.Cluster("h:budget#0", [
    "The city council approved a new budget.", "The budget adds money for buses.",
    "Bus riders welcomed the council budget.", "Night buses will run every hour."],
    [0, 0, 1, 1], ["The council approved a budget with more money for buses."])
FINAL = B.Cluster("h:final#0", [
    "The home team won the cup final.", "Fans filled the main square.", "The final ended two goals to one.",
    "The coach praised the home team.", "Tickets sold out in an hour."],
    [0, 0, 1, 1, 1], ["The home team won the final two goals to one."])
# one sentence shares its words with two others that share none with each other, and one stands apart
FRUIT = B.Cluster("h:fruit#0", ["Red apples and green pears.", "Red apples grow here.", "Green pears taste sweet.",
                                "Stocks fell sharply."], [0, 0, 1, 1], ["Apples and pears."])
HAND = [STORM, BUDGET, FINAL, FRUIT]


def test_first_k_takes_the_first_k_sentences_of_each_document():
    assert B.first_k(STORM.sentence_doc, 1) == [0, 3, 5]
    assert B.first_k(STORM.sentence_doc, 2) == [0, 1, 3, 4, 5, 6]
    assert B.first_k(STORM.sentence_doc, 3) == [0, 1, 2, 3, 4, 5, 6]    # documents shorter than k give all theirs
    assert B.first_k(FINAL.sentence_doc, 2) == [0, 1, 2, 3]
    assert B.first_k([], 3) == []


def test_the_budget_adds_sentences_until_it_is_reached_and_returns_source_order():
    s = STORM.sentences                                          # words: 8, 6, 3, 11, 5, 7, 8
    assert B.up_to_budget([3, 0, 2], s, 10) == [3]               # 11 words reach 10 at once
    assert B.up_to_budget([2, 1, 0], s, 10) == [0, 1, 2]         # 3 + 6 < 10: the third crosses it
    assert B.up_to_budget([2, 1, 0], s, 9) == [1, 2]             # 3 + 6 reach 9
    assert B.up_to_budget([4, 1], s, 100) == [1, 4]              # the cluster runs out first
    assert B.up_to_budget([0, 1, 2], s, 20, skip=lambda i, chosen: i == 1) == [0, 2]


def test_the_oracle_is_the_naive_rouge_score_greedy_uncapped():
    for c in HAND:
        want = greedy_rouge_score(c.sentences, c.reference, max_sentences=len(c.sentences))
        assert B.oracle(c.sentences, c.reference) == want, c.doc_id
    # "storm hit the", the homes sentence and Friday's: each raises ROUGE-1 F + ROUGE-2 F; a fourth would not
    assert B.oracle(STORM.sentences, STORM.reference) == [0, 3, 5]


def test_lexrank_ranks_as_the_lexrank_package_summarizes():
    from lexrank import STOPWORDS, LexRank

    model = B.lexrank_model(HAND)
    library = LexRank([c.sentences for c in HAND], stopwords=STOPWORDS["en"])
    for c in HAND:
        order = B.lexrank_order(model, c.sentences)
        assert sorted(order) == list(range(len(c.sentences)))
        assert [c.sentences[i] for i in order] == library.get_summary(c.sentences, summary_size=len(c.sentences),
                                                                      threshold=0.03)
    assert B.lexrank_order(model, FRUIT.sentences)[0] == 0          # the sentence linked to both others
    assert B.lexrank_order(model, []) == []


def test_the_centroid_skips_near_copies_and_stops_at_the_budget():
    c = ["Storm hits the coast.", "Storm hits the coast!", "Power fails on the coast.", "A cat sleeps."]
    picked = B.centroid(c, budget=8)
    assert 0 in picked and 1 not in picked                           # the copy (cosine 1 > 0.5) is passed over
    assert picked == [0, 2]                                          # 4 + 5 words reach 8
    assert B.centroid(c, budget=100) == [0, 2, 3]


def test_clusters_are_read_and_segmented_as_prep_reads_them():
    clusters, skipped = B.read_clusters(B.cluster_source(str(FIXTURE)))
    assert [c.doc_id for c in clusters] == [f"multinews_plus:{i}#0" for i in range(101, 107)] and not skipped
    dam = clusters[0]
    assert dam.sentence_doc == [0, 0, 0, 1, 2, 2] and dam.sentences[3] == "A singer posted a photo of her lunch."
    assert dam.reference == ["The dam opened its gates and water reached the valley.", "Engineers said it held."]
    relevant, skipped = B.read_clusters(B.cluster_source(str(FIXTURE), relevant=True))
    assert [c.doc_id for c in relevant] == ["multinews_plus:101#0", "multinews_plus:102#0", "multinews_plus:106#0"]
    assert skipped == {"no_relevant_documents": 1, "malformed_relevant": 2}
    assert relevant[0].sentence_doc == [0, 0, 0, 1, 1] and "singer" not in " ".join(relevant[0].sentences)


def _tables():
    spec = importlib.util.spec_from_file_location("doc_tables", REPO / "docs" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclass looks its module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_the_report_becomes_a_results_file_the_tables_render(tmp_path, monkeypatch):
    from hibert.cli import main as hibert

    out = tmp_path / "runs" / "mn" / "report-test"
    assert B.main(["--input", str(FIXTURE), "--out", str(out), "--budget-words", "12", "--bootstrap", "50"]) == 0
    report = json.loads((out / "report.json").read_text())
    rows = ["first1", "first2", "first3", "lexrank", "lexrank_fabbri_500w", "centroid", "oracle"]
    assert list(report["scores"]) == rows and report["meta"]["budget_words"] == 12
    ids = report["per_document"]["doc_ids"]
    assert ids[0] == "multinews_plus:101#0" and len(ids) == 6
    words = {r: report["abstractiveness"][r]["mean_words"] for r in rows}
    assert words["first1"] < words["first2"] < words["first3"] and words["lexrank"] < words["lexrank_fabbri_500w"]
    assert set(report["meta"]["seconds"]) >= {"read_and_segment", *rows, "rouge_and_bootstrap"}

    monkeypatch.chdir(tmp_path)
    results = tmp_path / "docs" / "results" / "mn.json"
    items = [f"{r}={out}#{r}" for r in ["first3", *[r for r in rows if r != "first3"]]]
    assert hibert(["compare", *items, "--results", str(results)]) == 0
    data = json.loads(results.read_text())
    assert data["schema"] == "hibert-results/1" and data["reference"] == "first3" and data["documents"] == 6
    assert list(data["systems"]) == ["first3", *[r for r in rows if r != "first3"]]
    assert data["systems"]["lexrank"]["runs"][0]["words"] == pytest.approx(words["lexrank"])
    assert set(data["paired"]) == {f"{r}-first3" for r in rows if r != "first3"}
    tables = _tables()
    for view in ("rouge-seeds", "paired"):
        body, _ = tables.RESULT_VIEWS[view](data)
        assert len(body) == 2 + len(rows) - (view == "paired")
    assert "first3" in (out / "report.md").read_text()   # the report's own page is written too
