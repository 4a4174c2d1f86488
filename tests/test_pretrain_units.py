"""Pure pieces of the pretraining runtime: masking, batch plans, lr schedule, RNG state, checkpoint checks."""
import math
import random

import numpy as np
import pytest
import torch

from hibert.tokens import MASK_ID
from hibert.runtime.batching import doc_costs, plan_epoch
from hibert.runtime.checkpoint import verify, write_marker
from hibert.config.training import ObjectiveConfig
from hibert.pretrain.objective import KEEP, MASK, RANDOM, mask_document, num_selected, other_document_sentence
from hibert.runtime.rng_state import load_rng_state, save_rng_state
from hibert.runtime.schedule import lr_multiplier


def _docs(n_docs=50, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.integers(10, 100, size=rng.integers(3, 12)).astype(np.int32)
             for _ in range(rng.integers(1, 31))] for _ in range(n_docs)]


@pytest.mark.parametrize("n,expected", [(1, 1), (3, 1), (6, 1), (7, 1), (10, 2), (20, 3), (30, 5)])
def test_num_selected_is_15_percent_at_least_one(n, expected):
    assert num_selected(n, ObjectiveConfig()) == expected


def test_num_selected_cap():
    assert num_selected(30, ObjectiveConfig(max_selected=2)) == 2


def test_masking_is_pure_function_of_seed_epoch_doc():
    docs = _docs()
    spec = ObjectiveConfig()
    a = mask_document(docs[7], spec, 1, 2, 7, other_document_sentence(docs, 7))
    b = mask_document(docs[7], spec, 1, 2, 7, other_document_sentence(docs, 7))
    assert a.positions == b.positions and a.actions == b.actions
    assert all(np.array_equal(x, y) for x, y in zip(a.sentences, b.sentences))
    c = mask_document(docs[7], spec, 1, 3, 7, other_document_sentence(docs, 7))  # another epoch
    d = mask_document(docs[7], spec, 2, 2, 7, other_document_sentence(docs, 7))  # another seed
    assert (c.positions, c.actions) != (a.positions, a.actions) or (d.positions, d.actions) != (a.positions, a.actions)


def test_masking_actions_follow_80_10_10_and_keep_lengths():
    docs = _docs(400, seed=1)
    spec = ObjectiveConfig()
    counts = {MASK: 0, KEEP: 0, RANDOM: 0}
    for i, doc in enumerate(docs):
        m = mask_document(doc, spec, 0, 0, i, other_document_sentence(docs, i))
        assert len(m.positions) == num_selected(len(doc), spec)
        for pos, act, tgt in zip(m.positions, m.actions, m.targets):
            counts[act] += 1
            assert np.array_equal(tgt, doc[pos])  # targets are the ORIGINAL sentences
            if act == MASK:
                assert len(m.sentences[pos]) == len(doc[pos]) and (m.sentences[pos] == MASK_ID).all()
            elif act == KEEP:
                assert np.array_equal(m.sentences[pos], doc[pos])
        unselected = set(range(len(doc))) - set(m.positions)
        assert all(np.array_equal(m.sentences[j], doc[j]) for j in unselected)
    total = sum(counts.values())
    assert abs(counts[MASK] / total - 0.8) < 0.05
    assert abs(counts[KEEP] / total - 0.1) < 0.04 and abs(counts[RANDOM] / total - 0.1) < 0.04


def test_random_sentence_comes_from_another_document():
    docs = [[np.full(3, d, dtype=np.int32) for _ in range(4)] for d in range(5)]  # doc d's tokens are all d
    draw = other_document_sentence(docs, 2)
    rng = np.random.default_rng(0)
    seen = {int(draw(rng)[0]) for _ in range(200)}
    assert seen == {0, 1, 3, 4}


def _costs(n=500, seed=0):
    rng = np.random.default_rng(seed)
    sents = rng.integers(1, 31, size=n)
    toks = sents * rng.integers(5, 40, size=n)
    return doc_costs(toks, sents)


def test_plan_respects_budget_and_covers_every_doc():
    costs = _costs()
    plan = plan_epoch(costs, seed=0, epoch=0, batch_tokens=2000, max_docs=16, world=2, accum=2)
    flat = np.concatenate(plan.batches)
    assert sorted(flat.tolist()) == list(range(len(costs)))
    for b in plan.batches:
        assert len(b) <= 16
        assert costs[b].sum() <= 2000 or len(b) == 1


def test_plan_deterministic_and_changes_per_epoch():
    costs = _costs()
    a = plan_epoch(costs, seed=3, epoch=1, batch_tokens=2000, max_docs=16, world=1, accum=1)
    b = plan_epoch(costs, seed=3, epoch=1, batch_tokens=2000, max_docs=16, world=1, accum=1)
    c = plan_epoch(costs, seed=3, epoch=2, batch_tokens=2000, max_docs=16, world=1, accum=1)
    assert all(np.array_equal(x, y) for x, y in zip(a.batches, b.batches))
    assert not all(np.array_equal(x, y) for x, y in zip(a.batches, c.batches))


def test_two_ranks_see_the_global_batches_of_one_process_with_accumulation():
    costs = _costs()
    one = plan_epoch(costs, seed=0, epoch=0, batch_tokens=2000, max_docs=16, world=1, accum=2)
    two = plan_epoch(costs, seed=0, epoch=0, batch_tokens=2000, max_docs=16, world=2, accum=1)
    assert one.steps == two.steps
    r0, r1 = two.rank_batches(0, 2, 1), two.rank_batches(1, 2, 1)
    single = one.rank_batches(0, 1, 2)
    assert len(r0) == len(r1) == one.steps  # same number of steps on every rank
    for s in range(one.steps):
        assert np.array_equal(single[2 * s], r0[s]) and np.array_equal(single[2 * s + 1], r1[s])


def test_resume_slice_is_the_tail():
    costs = _costs()
    plan = plan_epoch(costs, seed=0, epoch=0, batch_tokens=2000, max_docs=16, world=2, accum=2)
    full = plan.rank_batches(1, 2, 2)
    tail = plan.rank_batches(1, 2, 2, start_step=3)
    assert all(np.array_equal(x, y) for x, y in zip(full[6:], tail))


def test_lr_schedule_warmup_then_inverse_sqrt_and_linear():
    assert lr_multiplier(0, 4, "inverse_sqrt", None) == pytest.approx(0.25)
    assert lr_multiplier(3, 4, "inverse_sqrt", None) == pytest.approx(1.0)
    assert lr_multiplier(15, 4, "inverse_sqrt", None) == pytest.approx(math.sqrt(4 / 16))
    assert lr_multiplier(3, 4, "linear", 12) == pytest.approx(1.0)
    assert lr_multiplier(7, 4, "linear", 12) == pytest.approx(0.5)
    assert lr_multiplier(20, 4, "linear", 12) == 0.0
    assert lr_multiplier(100, 0, "constant", None) == 1.0
    with pytest.raises(ValueError):
        lr_multiplier(5, 0, "linear", None)


def test_rng_state_round_trip(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_rng_state(tmp_path / "rng.safetensors")
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    load_rng_state(tmp_path / "rng.safetensors")
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert expected[0] == got[0] and expected[1] == got[1] and torch.equal(expected[2], got[2])


def test_checkpoint_verify_detects_missing_marker_and_truncation(tmp_path):
    tag = tmp_path / "step_000000010"
    tag.mkdir()
    (tag / "a.pt").write_bytes(b"x" * 100)
    assert verify(tag)[0] is False  # no marker: the save did not complete
    write_marker(tag, step=10, world_size=1, state={})
    assert verify(tag) == (True, "ok")
    (tag / "a.pt").write_bytes(b"x" * 50)
    ok, why = verify(tag)
    assert not ok and "truncated" in why


def _per_document_batch(docs, idx, spec, seed, epoch):
    """The reference: mask_document on each document's sentence arrays, then make_pretrain_batch."""
    from hibert.modeling import make_pretrain_batch

    masked = [mask_document(docs[i], spec, seed, epoch, i, other_document_sentence(docs, i)) for i in idx]
    return make_pretrain_batch([m.sentences for m in masked], [m.positions for m in masked],
                               [m.targets for m in masked]), masked


def test_batch_masking_equals_per_document_masking():
    """mask_batch (flat, the loader's path) draws exactly what mask_document draws: same masks, same
    random sentences, same targets, every field of the packed batch equal."""
    from hibert.modeling.pretraining import make_pretrain_batch_flat
    from hibert.pretrain.objective import mask_batch
    from test_modeling_packing import _assert_same_bundle

    docs = _docs(300, seed=3)
    spec = ObjectiveConfig(mask_prob=0.4, keep_prob=0.2, random_prob=0.4, select_ratio=0.3)
    idx = np.random.default_rng(0).choice(len(docs), size=64, replace=False)
    m = mask_batch(docs, idx, spec, 5, 2)
    fast = make_pretrain_batch_flat(m.words, m.word_lens, m.doc_lens, m.target_rows, m.target_words,
                                    m.target_word_lens)
    ref, masked = _per_document_batch(docs, idx, spec, 5, 2)
    actions = [a for x in masked for a in x.actions]
    assert {MASK, KEEP, RANDOM} <= set(actions)
    random_lens_differ = any(len(x.sentences[p]) != len(docs[i][p])
                             for i, x in zip(idx, masked) for p, a in zip(x.positions, x.actions) if a == RANDOM)
    assert random_lens_differ  # the splice of a sentence of another length is exercised
    _assert_same_bundle(fast, ref)


def test_loader_item_equals_per_document_masking_on_prepared_shards(tiny_data):
    """The task's make_item over the shards' flat reads equals the per-document reference."""
    from hibert.data_prep import DocumentDataset
    from hibert.config import load_config
    from hibert.modeling import flops_per_batch
    from hibert.pretrain.masked_sentence import MaskedSentenceTask
    from test_modeling_packing import _assert_same_bundle

    ds = DocumentDataset(tiny_data["open"], "train")
    cfg = load_config(None, ["model=hibert_tiny", "objective.mask_prob=0.5", "objective.keep_prob=0.2",
                             "objective.random_prob=0.3"])
    task = MaskedSentenceTask(cfg, 600)
    idx = np.arange(len(ds))[::-1].copy()
    item = task.make_item(ds, idx, 4)
    ref, masked = _per_document_batch(ds, idx, cfg.objective, cfg.schedule.seed, 4)
    assert any(len(x.sentences[p]) != len(ds[i][p])  # a random sentence of another length is spliced in
               for i, x in zip(idx, masked) for p, a in zip(x.positions, x.actions) if a == RANDOM)
    _assert_same_bundle(item.batch, ref)
    d = ref.docs
    assert item.flops == flops_per_batch(task.model_config(), d.sent_lens, d.doc_lens, ref.target_lens)
    assert item.real_tokens == d.num_real_tokens + ref.num_target_tokens
    flat, lens = ds.flat(3)
    assert [x.tolist() for x in np.split(flat, np.cumsum(lens)[:-1])] == [x.tolist() for x in ds[3]]
