"""Batched beam search (modeling/generate.py) on tiny random models (CPU): batch independence, greedy,
word-level n-gram blocking against a slow reference, length rules, GNMT scores, exact early stopping."""
import math
import sys

import numpy as np
import pytest
import torch

from conftest import REPO
from hibert.config.abstractive import GenerationConfig
from hibert.finetune.abstractive.data import make_abstractive_batch
from hibert.tokens import BOS_ID, EOS_ID, MASK_ID, PAD_ID, SEP_ID, UNK_ID
from hibert.modeling.generate import NEVER_GENERATED, NgramBlocker, _top_candidates, generate, gnmt_penalty, greedy
from hibert.modeling.packing import pack_documents
from test_modeling_abstractive import V, favour_eos, random_docs, tiny_model

sys.path.insert(0, str(REPO / "benchmarks"))  # the reference searches are the benchmarks'
from anchor_decode import anchor_generate  # noqa: E402
from recompute_decode import RecomputePrefix  # noqa: E402

WORD_START = torch.from_numpy(np.random.default_rng(0).random(V) < 0.6)
WORD_START[:6] = True  # specials stand alone


def words_of(tokens: list[int]) -> list[tuple[int, ...]]:
    words: list[tuple[int, ...]] = []
    for t in tokens:
        if not words or WORD_START[t]:
            words.append((t,))
        else:
            words[-1] += (t,)
    return words


def has_repeat(words: list, n: int) -> bool:
    grams = [tuple(words[j:j + n]) for j in range(len(words) - n + 1)]
    return len(grams) != len(set(grams))


def banned_reference(prefix: list[int], n: int, final: bool) -> set[int]:
    """The blocking rule, slowly: a candidate is banned iff, once the words it completes are complete,
    the hypothesis holds a repeated word n-gram. A word-start piece or EOS completes the open last word;
    at the last free step (EOS is forced next) every candidate's own word completes too."""
    banned = set()
    closes_open = has_repeat(words_of(prefix), n)
    for c in range(V):
        if (c == EOS_ID or WORD_START[c]) and closes_open:
            banned.add(c)
        elif final and c != EOS_ID and has_repeat(words_of(prefix + [c]), n):
            banned.add(c)
    return banned


def run(model, docs, **gen) -> list:
    cfg = GenerationConfig(**{"beam_size": 4, "min_length": 0, "max_length": 12, "no_repeat_ngram": 3, **gen})
    return generate(model, pack_documents(docs), cfg, word_start=WORD_START)


@torch.no_grad()
def sequence_log_prob(model, doc, tokens: list[int]) -> float:
    """Teacher-forced sum of log p over the tokens and the EOS."""
    batch = make_abstractive_batch([doc], [np.asarray(tokens, dtype=np.int64)])
    logp = model(batch, return_log_probs=True).log_probs
    return logp.gather(1, batch.dec_labels[:, None]).sum().item()


# ---------------------------------------------------------------------------------------------- batching
@pytest.mark.parametrize("cross,copy,seed,eos",
                         [("flat", False, 4, 2.0), ("pht", True, 3, 3.0), ("vht", False, 3, 2.0)])
def test_each_document_decodes_as_it_does_alone(cross, copy, seed, eos):
    """Mixed lengths, beam 4, blocking on, documents finishing at different steps (they leave the batch as
    they finish): every document gets the tokens and score it gets alone."""
    model = favour_eos(tiny_model(cross, copy, seed=seed), eos)
    docs = random_docs(20, n_docs=8, max_sents=6, max_words=14)
    sizes = []
    step = model.decode_step
    model.decode_step = lambda tokens, state: sizes.append(state.num_docs) or step(tokens, state)
    together = run(model, docs, min_length=2)
    assert len(set(sizes)) >= 3, sorted(set(sizes))  # the batch really shrinks along the way, twice or more
    for doc, h in zip(docs, together):
        alone = run(model, [doc], min_length=2)[0]
        assert alone.tokens == h.tokens
        assert abs(alone.score - h.score) < 1e-4


def test_scores_are_gnmt_normalised_log_probs_of_the_tokens():
    model = favour_eos(tiny_model(seed=4), 2.0)
    docs = random_docs(21, n_docs=4)
    for doc, h in zip(docs, run(model, docs, length_penalty=0.6)):
        assert h.finished
        log_prob = sequence_log_prob(model, doc, h.tokens)
        assert abs(h.log_prob - log_prob) < 1e-4
        assert abs(h.score - log_prob / ((5 + len(h.tokens) + 1) / 6) ** 0.6) < 1e-4


def test_gnmt_penalty_hand_case():
    assert gnmt_penalty(10, 0.6) == pytest.approx((15 / 6) ** 0.6) == pytest.approx(1.73286, abs=1e-5)
    assert gnmt_penalty(1, 0.0) == 1.0 and gnmt_penalty(1, 1.0) == 1.0
    torch.testing.assert_close(gnmt_penalty(torch.tensor([1.0, 7.0]), 2.0), torch.tensor([1.0, 4.0]))


# ---------------------------------------------------------------------------------------------- greedy
def greedy_reference(model, doc, gen: GenerationConfig) -> tuple[list[int], float]:
    """Greedy decoding written out with full teacher-forced forwards: the best token at every step; when
    that is EOS the summary is a finished candidate (score = log p / GNMT penalty) and decoding goes on
    with the best other token, until no open continuation can beat the best finished score (its bound:
    open log p / penalty at max_length + 1) or max_length forces EOS."""
    prefix, total, best = [], 0.0, (-math.inf, [])
    bound_lp = gnmt_penalty(gen.max_length + 1, gen.length_penalty)
    for t in range(gen.max_length + 1):
        batch = make_abstractive_batch([doc], [np.asarray(prefix, dtype=np.int64)])
        with torch.no_grad():
            logp = model(batch, return_log_probs=True).log_probs[-1].clone()
        logp[[PAD_ID, UNK_ID, BOS_ID, MASK_ID]] = -math.inf
        if t < gen.min_length:
            logp[EOS_ID] = -math.inf
        if t == gen.max_length or int(logp.argmax()) == EOS_ID:
            score = (total + logp[EOS_ID].item()) / gnmt_penalty(t + 1, gen.length_penalty)
            best = max(best, (score, list(prefix)), key=lambda x: x[0])
            if t == gen.max_length:
                break
            logp[EOS_ID] = -math.inf
        token = int(logp.argmax())
        total += logp[token].item()
        prefix.append(token)
        if best[0] >= total / bound_lp:
            break
    return best[1], best[0]


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_one_is_greedy(alpha):
    model = favour_eos(tiny_model("pht", copy=True, seed=5), 2.0)
    docs = random_docs(22, n_docs=4)
    gen = GenerationConfig(beam_size=1, min_length=2, max_length=15, length_penalty=alpha, no_repeat_ngram=0)
    hyps = greedy(model, pack_documents(docs), gen)
    assert [h.tokens for h in hyps] == [h.tokens for h in generate(model, pack_documents(docs), gen)]
    for doc, h in zip(docs, hyps):
        tokens, score = greedy_reference(model, doc, gen)
        assert h.tokens == tokens
        assert abs(h.score - score) < 1e-4


# ---------------------------------------------------------------------------------------------- n-grams
def test_blocker_hand_case():
    """Words a b c a b, then c: the open word 'c' completes (a b c) again only once the next token starts a
    word (or is EOS); a continuation piece turns it into another word and is allowed."""
    ws = torch.zeros(12, dtype=torch.bool)
    ws[[EOS_ID, 6, 7, 8]] = True        # 6, 7, 8 start words; 9, 10 continue them
    blocker = NgramBlocker(3, ws, rows=2, max_words=10)
    seqs = torch.tensor([[6, 7, 8, 6, 7, 8], [6, 7, 8, 6, 7, 9]])  # row 1: the 2nd 'b' is 'b+9'
    banned = []
    for t in range(seqs.shape[1]):
        banned.append(blocker.banned().tolist())
        blocker.push(seqs[:, t])
    mask = blocker.banned_mask()
    assert banned == [[False, False]] * 6 and mask[0].tolist() == ws.tolist() and not mask[1].any()
    final = blocker.banned_mask(final=True)  # next token is the last: its own word completes at EOS
    assert final[0].tolist() == ws.tolist()
    assert not final[1].any()
    blocker.push(torch.tensor([10, 6]))     # row 0: 'c+10' is a new word; row 1: 'a' after (a, b+9)
    assert blocker.banned().tolist() == [False, False]
    final = blocker.banned_mask(final=True)
    assert final[0].nonzero().flatten().tolist() == []
    assert final[1].nonzero().flatten().tolist() == []  # (b+9, a, x) never occurred


def test_no_repeated_word_trigram_in_200_decodes_and_the_ban_matches_the_reference():
    checked = 0

    def trace(step, prefixes, banned):
        nonlocal checked
        if checked > 3000:
            return
        for prefix, row in zip(prefixes.tolist(), banned):
            assert banned_reference(prefix, 3, step == max_len - 1) == set(row.nonzero().flatten().tolist())
            checked += 1

    max_len = 24
    gen = GenerationConfig(beam_size=3, min_length=0, max_length=max_len, no_repeat_ngram=3)
    repeats_blocked = repeats_free = decodes = 0
    for seed in range(25):
        model = tiny_model(seed=seed)
        docs = random_docs(100 + seed, n_docs=8)
        packed = pack_documents(docs)
        hyps = generate(model, packed, gen, word_start=WORD_START, trace=trace)
        free = generate(model, packed, gen.model_copy(update={"no_repeat_ngram": 0}))
        repeats_blocked += sum(has_repeat(words_of(h.tokens), 3) for h in hyps)
        repeats_free += sum(has_repeat(words_of(h.tokens), 3) for h in free)
        assert all(h.finished for h in hyps)
        decodes += len(hyps)
    assert decodes == 200 and checked > 3000
    assert repeats_blocked == 0
    assert repeats_free > 50  # random models do repeat: the blocking is what removes them


def test_word_piece_cap_bounds_every_word_and_keeps_batch_independence():
    """Random models stack continuation pieces; with max_word_pieces=2 no word has more than 2 pieces,
    every document of the batch decodes as it does alone (the cap's state follows the backpointers), and
    with word trigram blocking on too nothing repeats and every beam search finishes."""
    gen = GenerationConfig(beam_size=3, min_length=16, max_length=20, no_repeat_ngram=0, max_word_pieces=2)
    long_free = 0
    for seed in range(4):
        model = tiny_model(seed=seed)
        docs = random_docs(300 + seed, n_docs=6)
        packed = pack_documents(docs)
        capped = generate(model, packed, gen, word_start=WORD_START)
        free = generate(model, packed, gen.model_copy(update={"max_word_pieces": 0}))
        assert all(len(w) <= 2 for h in capped for w in words_of(h.tokens))
        long_free += sum(len(w) > 2 for h in free for w in words_of(h.tokens))
        for doc, h in zip(docs[:3], capped):
            alone = generate(model, pack_documents([doc]), gen, word_start=WORD_START)[0]
            assert alone.tokens == h.tokens and abs(alone.score - h.score) < 1e-4
        both = generate(model, packed, gen.model_copy(update={"no_repeat_ngram": 3}), word_start=WORD_START)
        assert all(h.finished and not has_repeat(words_of(h.tokens), 3) for h in both)
    assert long_free > 10  # without the cap these models do build long words


def test_dead_ends_return_the_best_open_beam_without_its_open_word():
    """Every piece starts a word and no word may repeat (n = 1): a beam that emits a repeated word has
    nothing left to do (EOS is banned below min_length) and dies. With every beam dead and nothing
    finished, a document returns its best open beam minus the open last word, marked unfinished."""
    model = tiny_model(seed=1, max_positions=80)
    docs = random_docs(30, n_docs=3)
    gen = GenerationConfig(beam_size=2, min_length=70, max_length=70, no_repeat_ngram=1)
    every_piece = torch.ones(V, dtype=torch.bool)
    for doc, h in zip(docs, generate(model, pack_documents(docs), gen, word_start=every_piece)):
        assert not h.finished and len(h.tokens) < 70
        assert len(set(h.tokens)) == len(h.tokens)  # the repeated open word is not returned
        batch = make_abstractive_batch([doc], [np.asarray(h.tokens, dtype=np.int64)])
        with torch.no_grad():
            logp = model(batch, return_log_probs=True).log_probs
        want = logp.gather(1, batch.dec_labels[:, None])[:-1].sum().item()  # its tokens, no EOS
        assert abs(h.log_prob - want) < 1e-4 and abs(h.score - want / gnmt_penalty(len(h.tokens), 0.6)) < 1e-4


def test_candidates_tie_by_lower_index():
    scores = torch.tensor([[0.0, -1.0, 0.0, float("-inf"), 0.0, -1.0]])
    top, index = _top_candidates(scores, 5)
    assert index.tolist() == [[0, 2, 4, 1, 5]] and top.tolist() == [[0.0, 0.0, 0.0, -1.0, -1.0]]


@pytest.mark.parametrize("n", [5 * 640, 5 * 643])  # whole blocks; a tail that fills no block
def test_block_prefiltered_candidates_equal_a_full_sort(n):
    """The block-maximum prefilter returns exactly the k best by (score, lower index): ties inside and
    across blocks, several of the best in one block, -inf rows and blocks, the best in the tail."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(-40, 0, (6, n), generator=g).float()         # many exact ties
    scores[1, 1000:1010] = 5.0                                           # the 10 best in one block
    scores[2] = float("-inf")
    scores[2, [7, 3000, n - 1]] = torch.tensor([-1.0, -1.0, -2.0])       # only 3 finite, one in the tail
    scores[3, :2000] = float("-inf")
    scores[4, n - 1] = 9.0
    top, index = _top_candidates(scores, 10)
    for r in range(6):
        order = sorted(range(n), key=lambda i: (-scores[r, i].item(), i))[:10]
        finite = [i for i in order if scores[r, i] > float("-inf")]  # -inf candidates are never used
        assert index[r, : len(finite)].tolist() == finite and top[r].tolist() == scores[r, order].tolist()


# ---------------------------------------------------------------------------------------------- lengths
def test_max_length_and_min_length():
    docs = random_docs(23, n_docs=4)
    never_ends = tiny_model(seed=6)
    assert [len(h.tokens) for h in run(never_ends, docs, max_length=7)] == [7] * 4  # forced EOS after 7
    eager = favour_eos(tiny_model(seed=6), 6.0)
    short = [len(h.tokens) for h in run(eager, docs, max_length=20)]
    assert max(short) < 5
    long = [len(h.tokens) for h in run(eager, docs, max_length=20, min_length=5)]
    assert min(long) >= 5 and 5 in long
    assert all(EOS_ID not in h.tokens and BOS_ID not in h.tokens for h in run(eager, docs, min_length=3))


def test_early_stopping_is_exact_and_stops_early():
    model = favour_eos(tiny_model("vht", seed=7), 2.0)
    docs = random_docs(24, n_docs=6)
    steps = []
    step = model.decode_step
    model.decode_step = lambda *a: steps.append(1) or step(*a)
    early = run(model, docs, max_length=30, early_stopping=True)
    n_early = len(steps)
    full = run(model, docs, max_length=30, early_stopping=False)
    assert len(steps) - n_early == 31 and n_early < 20   # without it every document runs to max_length
    assert len({len(h.tokens) for h in early}) > 1
    assert [(h.tokens, h.score) for h in early] == [(h.tokens, h.score) for h in full]


def test_deterministic_nbest_and_cache_free_path():
    model = favour_eos(tiny_model("vht", copy=True, seed=8), 2.0)
    docs = random_docs(25, n_docs=5)
    gen = GenerationConfig(beam_size=4, max_length=15, no_repeat_ngram=3)
    packed = pack_documents(docs)
    a = generate(model, packed, gen, word_start=WORD_START, n_best=3)
    b = generate(model, packed, gen, word_start=WORD_START, n_best=3)
    assert [(h.tokens, h.score) for h in a] == [(h.tokens, h.score) for h in b]
    for h in a:
        assert h.nbest[0] is h and 1 <= len(h.nbest) <= 3
        scores = [x.score for x in h.nbest]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(x.tokens) for x in h.nbest}) == len(h.nbest)
    recomputed = generate(RecomputePrefix(model), packed, gen, word_start=WORD_START)
    assert [h.tokens for h in recomputed] == [h.tokens for h in a]
    assert max(abs(x.score - y.score) for x, y in zip(recomputed, a)) < 1e-4


def test_search_runs_on_the_copy_mixture():
    model = tiny_model("flat", copy=True, seed=9)
    with torch.no_grad():
        model.decoder.copy_gate.bias.fill_(-40.0)  # p_gen ~ 0: only the document's own tokens are likely
    docs = random_docs(26, n_docs=4, max_words=5)
    for doc, h in zip(docs, run(model, docs, max_length=10, no_repeat_ngram=0)):
        source = {int(t) for s in doc for t in s} | {SEP_ID}  # a copied sentence end is a sentence break
        assert set(h.tokens) <= source and h.log_prob > -10 * (len(h.tokens) + 1)


def test_generation_arguments_are_checked():
    model = tiny_model()
    packed = pack_documents(random_docs(27, n_docs=1))
    with pytest.raises(ValueError, match="word_start"):
        generate(model, packed, GenerationConfig(no_repeat_ngram=3))
    with pytest.raises(ValueError, match="n_best"):
        generate(model, packed, GenerationConfig(beam_size=2, no_repeat_ngram=0), n_best=3)
    with pytest.raises(ValueError, match="max_positions"):
        generate(model, packed, GenerationConfig(max_length=100, no_repeat_ngram=0))


@pytest.mark.parametrize("cross,copy", [("flat", False), ("pht", True)])
def test_the_anchor_search_of_the_benchmark_decodes_what_greedy_does(cross, copy):
    """benchmarks/anchor_decode.py (PreSumm's search on our layers: tiled memory, concatenated cache) is the
    reference bench_generate measures us against; with one beam, no blocking and a forced length it must
    pick exactly our tokens, or the speed comparison would compare different work."""
    model = tiny_model(cross, copy=copy, seed=6)
    docs = random_docs(23, n_docs=3)
    gen = GenerationConfig(beam_size=1, min_length=9, max_length=9, no_repeat_ngram=0)
    ours = [h.tokens for h in greedy(model, pack_documents(docs), gen)]
    theirs = anchor_generate(model, pack_documents(docs), 1, 10, 10, 0.0, False, WORD_START, NEVER_GENERATED)
    assert [t[:9] for t in theirs] == ours and all(len(t) == 10 for t in theirs)
