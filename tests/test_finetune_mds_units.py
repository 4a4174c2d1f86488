"""The multi-document finetuning pieces that need no model: unit rankings, budget cuts, the ranking measure
(ROUGE-L recall of the top L' units) and the cluster baselines, on hand-checked cases."""
import math

import numpy as np
import pytest
from rouge_score import rouge_scorer

from hibert.finetune.base.clusters import budget_cut, rank_order, tfidf_scores
from hibert.finetune.base.clusters import lead_first_document, lead_tokens, tfidf_extract
from hibert.finetune.ranker.metrics import ranking_table, recall_at, selection_recall


def test_tfidf_scores_against_a_hand_computation():
    units = ["apple apple pie", "apple tart", "car engine"]
    # df: apple 2, pie 1, tart 1, car 1, engine 1; smoothed idf = ln(4 / (1 + df)) + 1
    idf = {"apple": math.log(4 / 3) + 1, "pie": math.log(2) + 1, "tart": math.log(2) + 1,
           "car": math.log(2) + 1, "engine": math.log(2) + 1}
    vocab = list(idf)
    tf = [{"apple": 1 + math.log(2), "pie": 1}, {"apple": 1, "tart": 1}, {"car": 1, "engine": 1}]
    mat = np.array([[t.get(w, 0) * idf[w] for w in vocab] for t in tf])
    mat /= np.linalg.norm(mat, axis=1, keepdims=True)
    centroid = mat.mean(0)
    want = mat @ (centroid / np.linalg.norm(centroid))
    np.testing.assert_allclose(tfidf_scores(units), want, rtol=1e-12)
    # against a query (the title): only the units sharing its words score above 0
    q = tfidf_scores(units, "Apple pie recipes")
    assert q[0] > q[1] > 0 and q[2] == 0


def test_rank_order_is_stable_and_budget_cut_keeps_the_prefix_that_fits():
    order = rank_order(np.array([0.1, 0.5, 0.5, 0.9]))
    assert order.tolist() == [3, 1, 2, 0]          # ties keep document order
    tokens = np.array([10, 20, 30, 40])             # per unit
    assert budget_cut(order, tokens, 70, None).tolist() == [3, 1]      # 40 + 20 = 60 fits, + 30 does not
    assert budget_cut(order, tokens, 90, None).tolist() == [3, 1, 2]   # exactly 90
    assert budget_cut(order, tokens, 10, None).tolist() == [3]         # at least one unit
    assert budget_cut(order, tokens, 1000, 2).tolist() == [3, 1]       # at most `top`


def test_selection_recall_is_rouge_l_recall_of_the_top_units():
    units = [["the cat sat on the mat ."], ["dogs bark loudly ."], ["a cat and a dog met ."]]
    summary = ["the cat met a dog ."]
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    got = selection_recall(units, summary, np.array([2, 0, 1]), cutoffs=(1, 2))
    assert got[1] == pytest.approx(100 * scorer.score(summary[0], units[2][0])["rougeL"].recall)
    assert got[2] == pytest.approx(100 * scorer.score(summary[0], units[2][0] + " " + units[0][0])["rougeL"].recall)
    table = ranking_table([units], [summary], {"a": [np.array([2, 0, 1])], "b": [np.array([1, 0, 2])]},
                          cutoffs=(1,))
    assert table["a"][1][0] > table["b"][1][0]


def test_recall_at_counts_the_overlap_of_the_top_k():
    labels = np.array([0.9, 0.1, 0.5, 0.0])
    assert recall_at(np.array([3.0, 0.0, 2.0, 1.0]), labels, 2) == 1.0
    assert recall_at(np.array([0.0, 3.0, 2.0, 1.0]), labels, 2) == 0.5


def test_cluster_baselines():
    sents = ["a b c .", "d e .", "f g h i .", "j k ."]
    docs = [1, 1, 0, 0]
    assert lead_first_document(sents, docs, 3) == ["a b c .", "d e ."]       # only the first document
    assert lead_tokens(sents, 6) == ["a b c .", "d e"]                       # six words, cut inside
    assert lead_tokens(sents, 100) == sents
    picked = tfidf_extract(["the storm hit the coast", "the storm hit the coast", "rain fell on the coast",
                            "stocks rose"], k=2)
    assert len(picked) == 2 and picked[0] != picked[1]                       # the duplicate is filtered


def test_liu_lapata_lead_reads_the_title_then_the_ranked_units():
    from types import SimpleNamespace

    from hibert.finetune.base.clusters import ranked_sentences

    view = SimpleNamespace(title=lambda k: "storm season", sentences_text=lambda k: ["b b .", "a a ."])
    assert lead_tokens(ranked_sentences(view, 0), 4) == ["storm season", "b b"]
    untitled = SimpleNamespace(title=lambda k: None, sentences_text=lambda k: ["b b ."])
    assert ranked_sentences(untitled, 0) == ["b b ."]
