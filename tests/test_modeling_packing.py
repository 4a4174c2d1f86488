"""Batch layouts of modeling/: the padding-free packing and the padded reference layout."""
import numpy as np
import pytest
import torch

from hibert.tokens import BOS_ID, EOS_ID, MASK_ID, PAD_ID
from hibert.modeling import make_padded_pretrain_batch, make_pretrain_batch, pack_documents, pad_documents
from hibert.modeling.pretraining import IGNORE_INDEX

DOCS = [
    [[10, 11, 12], [13], []],          # an empty sentence still has its EOS
    [[20, 21, 22, 23, 24, 25, 26, 27, 28]],
    [[30, 31], [32, 33, 34], [35], [36, 37]],
]


def test_pack_layout_holds_every_real_token_once():
    p = pack_documents(DOCS, pad_to_multiple=8)
    assert p.tokens.shape == (8, 16)  # longest sentence 9 words + EOS = 10 -> 16
    assert p.num_docs == 3 and p.num_sentences == 8
    assert p.num_real_tokens == sum(len(s) + 1 for d in DOCS for s in d)
    assert p.sent_lens.tolist() == [4, 2, 1, 10, 3, 4, 2, 3]
    assert p.doc_index.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert p.sent_pos.tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    assert p.doc_lens.tolist() == [3, 1, 4]
    assert p.tokens[0].tolist() == [10, 11, 12, EOS_ID] + [PAD_ID] * 12
    assert p.tokens[2].tolist() == [EOS_ID] + [PAD_ID] * 15
    # the computed stream is exactly the real tokens, sentence after sentence
    stream = p.tokens.reshape(-1)[p.token_index]
    expected = [t for d in DOCS for s in d for t in list(s) + [EOS_ID]]
    assert stream.tolist() == expected
    assert (stream[p.eos_index] == EOS_ID).all()
    assert p.token_pos.tolist()[:6] == [0, 1, 2, 3, 0, 1]
    assert p.token_mask.sum(1).tolist() == p.sent_lens.tolist()
    assert p.token_cu.tolist() == [0, 4, 6, 7, 17, 20, 24, 26, 29]
    assert p.doc_cu.tolist() == [0, 3, 4, 8]
    assert p.doc_mask.shape == (3, 8) and p.doc_mask.sum(1).tolist() == [3, 1, 4]
    grid = torch.zeros(3 * 8, dtype=torch.long)
    grid[p.sent_slot] = torch.arange(1, 9)
    assert grid.view(3, 8)[2, :4].tolist() == [5, 6, 7, 8]


def test_pad_to_multiple_only_changes_widths():
    a, b = pack_documents(DOCS, pad_to_multiple=1), pack_documents(DOCS, pad_to_multiple=8)
    assert a.tokens.shape == (8, 10) and a.doc_mask.shape == (3, 4)
    assert torch.equal(a.tokens.reshape(-1)[a.token_index], b.tokens.reshape(-1)[b.token_index])
    assert torch.equal(a.token_pos, b.token_pos) and torch.equal(a.eos_index, b.eos_index)


def test_numpy_sentences_and_lists_pack_the_same():
    as_arrays = [[np.asarray(s, dtype=np.int32) for s in d] for d in DOCS]
    assert torch.equal(pack_documents(as_arrays).tokens, pack_documents(DOCS).tokens)


def test_padded_reference_layout():
    d = pad_documents(DOCS, max_sentences=5, max_tokens=12)
    assert d.is_padded_layout and d.token_index is None and d.sent_slot is None
    assert d.tokens.shape == (15, 13) and d.doc_mask.shape == (3, 5)
    assert d.real_rows().tolist() == [0, 1, 2, 5, 10, 11, 12, 13]
    assert d.tokens[5, :10].tolist() == DOCS[1][0] + [EOS_ID]
    assert (d.tokens.reshape(-1)[d.eos_index[d.real_rows()]] == EOS_ID).all()
    assert d.token_mask.any(1).all()  # no fully masked attention row, empty slots included
    assert d.num_real_tokens == pack_documents(DOCS).num_real_tokens
    with pytest.raises(ValueError):
        pad_documents(DOCS, max_sentences=3)
    with pytest.raises(ValueError):
        pad_documents(DOCS, max_tokens=8)


def test_bad_batches_are_rejected():
    with pytest.raises(ValueError):
        pack_documents([])
    with pytest.raises(ValueError):
        pack_documents([[[1, 2]], []])


def test_pretrain_batch_teacher_forcing_layout():
    masked = [[[10, 11, 12], [MASK_ID], [40]], [[20, 21]], [[MASK_ID] * 2, [32, 33, 34], [35], [36, 37]]]
    positions = [[1], [], [0, 3]]
    targets = [[[13]], [], [[30, 31], [36, 37]]]
    b = make_pretrain_batch(masked, positions, targets, pad_to_multiple=4)
    assert b.num_targets == 3 and b.max_target_len == 4 and b.num_target_tokens == 2 + 3 + 3
    assert b.target_rows.tolist() == [1, 4, 7]  # docs rows: doc 0 has 3 sentences, doc 1 one
    assert b.dec_tokens.tolist() == [BOS_ID, 13, BOS_ID, 30, 31, BOS_ID, 36, 37]
    assert b.dec_labels.tolist() == [13, EOS_ID, 30, 31, EOS_ID, 36, 37, EOS_ID]
    assert b.dec_pos.tolist() == [0, 1, 0, 1, 2, 0, 1, 2]
    assert b.dec_rows.tolist() == [1, 1, 4, 4, 4, 7, 7, 7]
    assert b.dec_cu.tolist() == [0, 2, 5, 8]
    assert b.target_lens.tolist() == [2, 3, 3]

    padded = make_padded_pretrain_batch(masked, positions, targets, max_sentences=4, max_tokens=5)
    assert padded.target_rows.tolist() == [1, 8, 11]
    assert padded.dec_index is None and padded.dec_tokens.shape == (3 * 6,)
    labels = padded.dec_labels.view(3, 6)
    assert labels[1].tolist() == [30, 31, EOS_ID] + [IGNORE_INDEX] * 3
    assert padded.dec_tokens.view(3, 6)[1].tolist() == [BOS_ID, 30, 31, PAD_ID, PAD_ID, PAD_ID]
    assert padded.num_target_tokens == b.num_target_tokens


def test_pretrain_batch_checks_targets():
    with pytest.raises(ValueError):
        make_pretrain_batch([[[1]]], [[1]], [[[2]]])     # position past the document
    with pytest.raises(ValueError):
        make_pretrain_batch([[[1]]], [[0]], [[]])        # positions and sentences disagree
    with pytest.raises(ValueError):
        make_pretrain_batch([[[1]]], [], [])             # one entry per document


def test_to_moves_every_tensor_and_keeps_ints():
    b = make_pretrain_batch([[[10, 11], [MASK_ID]]], [[1]], [[[12]]])
    moved = b.to("meta")
    assert moved.docs.tokens.device.type == "meta" and moved.dec_tokens.device.type == "meta"
    assert moved.docs.token_cu.device.type == "meta"
    assert moved.num_target_tokens == b.num_target_tokens and moved.docs.num_real_tokens == b.docs.num_real_tokens
    assert b.docs.tokens.device.type == "cpu"  # the original is untouched


def _assert_same_bundle(a, b) -> None:
    import dataclasses

    from hibert.modeling.packing import TensorBundle

    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), f.name
        elif isinstance(x, TensorBundle):
            _assert_same_bundle(x, y)
        else:
            assert x == y, f.name


def test_bundles_pickle_as_one_buffer_and_come_back_equal():
    # DataLoader workers hand batches over by pickling: one shared buffer per bundle, every field restored
    import pickle

    batch = make_pretrain_batch(DOCS, [[0, 2], [0], [1, 3]], [[[10, 11, 12], []], [[20, 21]], [[32, 33, 34], [36]]])
    back = pickle.loads(pickle.dumps(batch))
    _assert_same_bundle(batch, back)
    assert back.docs.tokens.untyped_storage().data_ptr() == back.docs.token_mask.untyped_storage().data_ptr()
    assert all(t.data_ptr() % 8 == 0 for t in (back.docs.token_mask, back.docs.token_cu, back.docs.doc_mask,
                                               back.docs.sent_lens))
    padded = make_padded_pretrain_batch(DOCS, [[0], [0], [1]], [[[10, 11, 12]], [[20]], [[32, 33, 34]]])
    _assert_same_bundle(padded, pickle.loads(pickle.dumps(padded)))  # None fields (token_index) survive too


@pytest.mark.parametrize("causal", [False, True])
def test_length_buckets_attend_exactly_like_one_grid(causal):
    """Many sequences of mixed lengths go to a few grids by length (`Layout.buckets`); every row gets what the
    one [num_seqs, max_len] grid gives it, and so do the gradients. Few sequences stay one grid."""
    from hibert.modeling.layers import Layout, attention

    rng = np.random.default_rng(3)
    lens = torch.as_tensor(np.concatenate([rng.integers(1, 12, 150), rng.integers(30, 50, 90)]))
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
    width = int(lens.max())
    index = torch.cat([torch.arange(n) + i * width for i, n in enumerate(lens.tolist())])
    mask = None if causal else torch.arange(width)[None] < lens[:, None]
    bucketed = Layout(len(lens), width, index, mask, causal=causal, cu_seqlens=cu)
    plain = Layout(len(lens), width, index, mask, causal=causal)
    assert bucketed.buckets is not None and len(bucketed.buckets) >= 2
    assert sum(b.src.numel() for b in bucketed.buckets) == int(lens.sum())
    assert max(b.max_len for b in bucketed.buckets[:-1]) < width  # the short sequences left the wide grid
    qkv = torch.randn(int(lens.sum()), 3 * 16, requires_grad=True)
    got = attention(qkv, bucketed, heads=2)
    (grad_got,) = torch.autograd.grad(got.square().sum(), qkv)
    want = attention(qkv, plain, heads=2)
    (grad_want,) = torch.autograd.grad(want.square().sum(), qkv)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad_got, grad_want, atol=1e-5, rtol=1e-5)
    few = Layout(20, width, index[: int(lens[:20].sum())], None if causal else mask[:20], causal=causal,
                 cu_seqlens=cu[:21])
    assert few.buckets is None
