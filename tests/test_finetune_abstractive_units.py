"""Abstractive evaluation helpers on hand-checked cases: novel n-grams, repetition, targets, [SEP] splits."""
import numpy as np
import pytest

from finetune.abstractive_data import split_sentences, target_ids
from finetune.abstractive_metrics import abstractiveness, novel_ngram_rate, repetition_rate
from hibert.tokens import SEP_ID


def test_novel_ngrams_by_hand():
    source = ["the cat sat on the mat .", "a dog barked ."]
    # 4 unigrams, one new ("bird"): 25%; bigrams: "the cat" old, "cat sat" old, "sat bird" new -> 1/3
    assert novel_ngram_rate(["the cat sat bird"], source, 1) == pytest.approx(0.25)
    assert novel_ngram_rate(["the cat sat bird"], source, 2) == pytest.approx(1 / 3)
    # an extract of source sentences has no novel n-grams, also across its sentence boundary
    assert novel_ngram_rate(["a dog barked .", "the cat sat on the mat ."], source, 3) == 0.0
    assert novel_ngram_rate(["short"], source, 2) is None


def test_repetition_by_hand():
    assert repetition_rate(["a b c a b c"]) == pytest.approx(1 / 4)  # trigrams abc bca cab abc: one repeat
    assert repetition_rate(["a b c", "a b c"]) == pytest.approx(1 / 2)
    assert repetition_rate(["a b"]) is None
    stats = abstractiveness([["x y z"], ["a b c"]], [["a b c"], ["a b c"]])
    assert stats["novel_1gram"] == pytest.approx(50.0) and stats["mean_words"] == 3.0


def test_target_joins_summary_sentences_with_sep_and_cuts():
    summary = [np.array([7, 8]), np.array([9]), np.array([10, 11])]
    assert target_ids(summary, 100).tolist() == [7, 8, SEP_ID, 9, SEP_ID, 10, 11]
    assert target_ids(summary, 4).tolist() == [7, 8, SEP_ID, 9]
    assert split_sentences([7, 8, SEP_ID, 9, SEP_ID, SEP_ID, 10]) == [[7, 8], [9], [10]]
