"""Oracle labels: equal to the naive greedy over rouge-score, to brute force on small cases, and scored
exactly as rouge-score scores them, on real documents (CNN/DM and BBC samples)."""
import itertools
import json
import random

import numpy as np
import pytest
from rouge_score import tokenizers

from hibert.data_prep.oracle import OracleProblem, RougeTokenizer, oracle_labels
from hibert.data_prep.oracle_reference import (exhaustive_rouge_score, greedy_presumm, greedy_rouge_score,
                                        set_score)
from hibert.data_prep.ptb import detokenize, split_sentences
from hibert.data_prep.records import split_paragraphs
from hibert.data_prep.summaries import split_glued


def _cnndm(repo, n):
    rows = [json.loads(line) for line in (repo / "samples" / "cnndm_val_sample.jsonl").read_text().splitlines()]
    return [([detokenize(s) for s in split_sentences(r["article"])],
             [x.strip() for x in r["highlights"].split(" . ") if x.strip()]) for r in rows[:n]]


def _bbc(repo, n):
    rows = [json.loads(line) for line in (repo / "samples" / "bbc_sample.jsonl").read_text().splitlines()]
    # sentences: the article's lines cut at ". " — any sentence list works for the equality checks
    out = []
    for r in rows[:n]:
        sents = [s for p in split_paragraphs(r["article"]) for s in p.replace(". ", ".\n").split("\n")]
        out.append((sents, split_glued(r["summary"], r["article"])))
    return out


def _chosen(labels):
    return [int(i) for i in np.flatnonzero(labels)]


def test_tokenizer_matches_rouge_score(repo):
    ref = tokenizers.DefaultTokenizer(use_stemmer=True)
    texts = [s for doc, summ in _cnndm(repo, 10) + _bbc(repo, 10) for s in doc + summ]
    texts += ["Kelvin \u212a, İstanbul, naïve café, 3.5% U.S.-led", "", "!!!", "multi\nline\ttext"]
    tok = RougeTokenizer()
    flat, lens = tok.ids_flat(texts)
    inv = {v: k for k, v in tok._stem_ids.items()}
    k = 0
    for text, n in zip(texts, lens):
        assert [inv[i] for i in flat[k:k + n]] == ref.tokenize(text), text
        k += n


@pytest.mark.parametrize("corpus", ["cnndm", "bbc"])
def test_greedy_equals_naive_rouge_score_greedy(repo, corpus):
    docs = _cnndm(repo, 8) if corpus == "cnndm" else _bbc(repo, 8)
    for i, (sents, summary) in enumerate(docs):
        for k in ((3, 1) if i < 2 else (3,)):
            assert _chosen(oracle_labels(sents, summary, max_sentences=k)) == greedy_rouge_score(sents, summary, k)


def test_internal_scores_are_rouge_score_scores_bit_for_bit(repo):
    tok = RougeTokenizer()
    for sents, summary in _cnndm(repo, 6):
        flat, lens = tok.ids_flat(sents + summary)
        n = sum(lens[:len(sents)])
        ids = np.array(flat)
        problem = OracleProblem(ids[:n], np.array(lens[:len(sents)]), ids[n:])
        st = problem.empty()
        rng = random.Random(0)
        for _ in range(4):  # grow a random set; every candidate's score must equal rouge-score's
            cand, scores, x2 = problem.expand(st)
            for c, s in zip(cand[:8], scores[:8]):
                assert s == set_score(sents, summary, (*st.chosen, int(c)))
            j = rng.randrange(len(cand))
            st = problem.add(st, cand[j], scores[j], x2[j])


def test_beam_with_a_wide_beam_is_brute_force(repo):
    rng = random.Random(1)
    pool = [s for sents, _ in _cnndm(repo, 10) for s in sents]
    for case in range(12):
        sents = rng.sample(pool, rng.randint(2, 7))
        summary = rng.sample(sents, 2) if case % 2 else [rng.choice(pool)]
        chosen, best = exhaustive_rouge_score(sents, summary, 3)
        got = _chosen(oracle_labels(sents, summary, 3, method="beam", beam_size=10_000))
        assert set_score(sents, summary, got) == best
        assert len(got) <= 3


def test_beam_is_never_worse_than_greedy(repo):
    for sents, summary in _cnndm(repo, 8):
        g = _chosen(oracle_labels(sents, summary, 3))
        b = _chosen(oracle_labels(sents, summary, 3, method="beam", beam_size=4))
        assert set_score(sents, summary, b) >= set_score(sents, summary, g)


def test_small_hand_cases():
    sents = ["the cat sat on the mat", "dogs bark loudly", "the cat sat", "nothing relevant here"]
    assert _chosen(oracle_labels(sents, ["the cat sat on the mat"])) == [0]
    assert _chosen(oracle_labels(sents, ["dogs bark. the cat sat on the mat"], 3)) == [0, 1]
    assert _chosen(oracle_labels(sents, ["zebra"])) == []
    assert _chosen(oracle_labels(["", "...", "the cat"], ["the cat"])) == [2]
    # adjacency bigram: "sat dogs" only exists when sentences 2 and 1 are joined in document order... (1 < 2)
    assert greedy_rouge_score(sents, ["dogs bark loudly the cat sat"], 2) == _chosen(
        oracle_labels(sents, ["dogs bark loudly the cat sat"], 2))


def test_presumm_reference_is_an_approximation(repo):
    docs = _cnndm(repo, 12)
    same = sum(greedy_presumm(s, m) == greedy_rouge_score(s, m) for s, m in docs)
    assert 0 < same < len(docs)  # set-based, unstemmed scores pick other sentences on some documents
    assert all(set(itertools.chain(greedy_presumm(s, m))) <= set(range(len(s))) for s, m in docs)


def test_boundary_bigrams_made_and_broken_score_like_rouge_score():
    # "b e" exists only when sentences 0 and 2 are adjacent in the candidate; adding 1 breaks it, adding 3
    # after 2 makes "f g"; an empty sentence between neighbours changes nothing
    sents = ["a b", "c d", "", "e f", "g h", "b e"]
    summary = ["b e f g", "d e"]
    tok = RougeTokenizer()
    ids, lens = tok.ids_flat(sents + summary)
    n = int(lens[:len(sents)].sum())
    problem = OracleProblem(ids[:n], lens[:len(sents)], ids[n:])
    for size in range(3):
        for chosen in itertools.combinations(problem.candidates.tolist(), size):
            st = problem.empty()
            for c in chosen:        # grow the state through expand/add, as greedy and beam do
                cand, scores, rows = problem.expand(st)
                j = cand.tolist().index(c)
                st = problem.add(st, c, scores[j], rows[j])
            cand, scores, _ = problem.expand(st)
            for c, s in zip(cand, scores):
                assert s == set_score(sents, summary, (*chosen, int(c))), (chosen, c)


def test_memory_is_linear_in_the_sentence_count():
    """A 20,000-sentence document (within max_doc_chars): no [n+1, n+1] table of boundary bigrams (3.2 GB here);
    the labels still come out, with a boundary bigram of the reference made across two chosen sentences."""
    import tracemalloc

    rng = np.random.default_rng(0)
    sentences = [" ".join(f"w{i}" for i in rng.integers(0, 3000, 6)) for _ in range(20_000)]
    tracemalloc.start()
    labels = oracle_labels(sentences, [sentences[7] + " " + sentences[9]])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20, peak
    assert labels[[7, 9]].tolist() == [1, 1] and labels.sum() == 2
