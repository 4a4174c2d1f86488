"""HIBERT encoder, masked-sentence pretraining model and extractive head on tiny configs (CPU)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hibert.config.model import ModelConfig
from hibert.tokens import MASK_ID
from hibert.modeling import (HibertEncoder, HibertExtractive, HibertForPretraining, make_padded_pretrain_batch,
                      make_pretrain_batch, pack_documents, pad_documents)

CFG = ModelConfig(name="test", vocab_size=60, hidden=32, layers=2, heads=4, dropout=0.0, max_positions=64)


def random_docs(seed: int, n_docs: int = 3, max_sents: int = 6, max_words: int = 9) -> list:
    rng = np.random.default_rng(seed)
    return [[rng.integers(6, CFG.vocab_size, rng.integers(0, max_words + 1)) for _ in range(rng.integers(1, max_sents + 1))]
            for _ in range(n_docs)]


def masked_batch_inputs(docs: list, seed: int = 0):
    """Select one sentence per document, mask it, keep its original words as the target."""
    rng = np.random.default_rng(seed)
    positions = [[int(rng.integers(len(d)))] for d in docs]
    masked = [[np.full(len(s), MASK_ID) if i == p[0] else s for i, s in enumerate(d)] for d, p in zip(docs, positions)]
    targets = [[d[p[0]]] for d, p in zip(docs, positions)]
    return masked, positions, targets


def seeded(cls, cfg=CFG, *args):
    torch.manual_seed(0)
    return cls(cfg, *args)


@torch.no_grad()
def test_encoder_shapes_and_views():
    docs = random_docs(1)
    p = pack_documents(docs)
    out = seeded(HibertEncoder).eval()(p)
    s, t = p.tokens.shape
    assert out.token_states.shape == (s, t, CFG.hidden)
    assert out.sentence_states.shape == (s, CFG.hidden)
    by_doc, mask = out.sentences_by_document()
    assert by_doc.shape == (3, p.max_doc_len, CFG.hidden) and torch.equal(mask, p.doc_mask)
    assert torch.equal(by_doc[mask], out.sentence_states)
    assert (by_doc[~mask] == 0).all() and (out.token_states[~p.token_mask] == 0).all()
    assert torch.equal(out.token_states[p.token_mask], out.token_flat)
    assert torch.isfinite(out.token_flat).all() and torch.isfinite(out.sentence_states).all()


@torch.no_grad()
def test_same_outputs_whatever_the_layout():
    docs = random_docs(2, n_docs=4)
    enc = seeded(HibertEncoder).eval()
    ref = enc(pack_documents(docs, pad_to_multiple=1))
    for layout in (pack_documents(docs, pad_to_multiple=8), pad_documents(docs, max_sentences=30, max_tokens=50)):
        out = enc(layout)
        rows = layout.real_rows()
        torch.testing.assert_close(out.sentence_states[rows], ref.sentence_states, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.token_states[rows][layout.token_mask[rows]], ref.token_flat, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(out.sentence_states).all()  # the padded layout's empty rows too


@torch.no_grad()
def test_document_encoding_does_not_depend_on_the_rest_of_the_batch():
    enc = seeded(HibertEncoder).eval()
    doc = random_docs(3, n_docs=1)
    alone = enc(pack_documents(doc)).sentence_states
    others = random_docs(4, n_docs=3, max_sents=12, max_words=30)  # wider grids at both levels
    batch = pack_documents(others[:1] + doc + others[1:])
    rows = batch.doc_index == 1
    torch.testing.assert_close(enc(batch).sentence_states[rows], alone, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_encoder_sees_the_masks_not_the_original_sentence():
    docs = random_docs(5)
    masked, positions, targets = masked_batch_inputs(docs)
    model = seeded(HibertForPretraining).eval()
    other_targets = [[np.asarray(t[0]) * 0 + 7] for t in targets]  # same lengths, other words
    a = make_pretrain_batch(masked, positions, targets)
    b = make_pretrain_batch(masked, positions, other_targets)
    torch.testing.assert_close(model.encoder(a.docs).sentence_states, model.encoder(b.docs).sentence_states,
                               atol=0, rtol=0)
    assert not torch.isclose(model(a).loss, model(b).loss)
    # changing the encoder input does change it, the other sentences of the document included (context)
    unmasked = make_pretrain_batch(docs, positions, targets)
    changed = (model.encoder(a.docs).sentence_states - model.encoder(unmasked.docs).sentence_states).abs().amax(1)
    assert (changed > 1e-4).all()


@torch.no_grad()
def test_pretraining_loss_is_nll_of_real_target_tokens():
    docs = random_docs(6, n_docs=4)
    batch = make_pretrain_batch(*masked_batch_inputs(docs))
    out = seeded(HibertForPretraining).eval()(batch, return_logits=True)
    assert out.logits.shape == (batch.num_target_tokens, CFG.vocab_size)  # no padding projected
    expected = F.cross_entropy(out.logits, batch.dec_labels, reduction="sum")
    torch.testing.assert_close(out.nll_sum, expected)
    torch.testing.assert_close(out.loss, expected / batch.num_target_tokens)
    assert out.num_target_tokens == batch.num_target_tokens


@torch.no_grad()
def test_pretraining_packed_equals_padded_reference():
    docs = random_docs(7, n_docs=4)
    inputs = masked_batch_inputs(docs)
    model = seeded(HibertForPretraining).eval()
    packed = model(make_pretrain_batch(*inputs, pad_to_multiple=1))
    padded = model(make_padded_pretrain_batch(*inputs))
    torch.testing.assert_close(packed.nll_sum, padded.nll_sum, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(packed.loss, padded.loss, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_decoder_is_causal_and_reads_the_document_vector():
    doc = [[np.arange(10, 15), np.arange(20, 26), np.arange(30, 34)]]
    model = seeded(HibertForPretraining).eval()
    target = np.arange(40, 46)
    changed = target.copy()
    changed[3] = 50  # input position 4 (after BOS) and label position 3
    a = model(make_pretrain_batch(doc, [[1]], [[target]]), return_logits=True).logits
    b = model(make_pretrain_batch(doc, [[1]], [[changed]]), return_logits=True).logits
    torch.testing.assert_close(a[:4], b[:4], atol=0, rtol=0)  # positions before the change see no difference
    assert (a[4:] - b[4:]).abs().amax() > 1e-4
    # the same words rebuilt at another position differ from the first step on: eq. 4's added vector
    c = model(make_pretrain_batch(doc, [[2]], [[target]]), return_logits=True).logits
    assert (a[0] - c[0]).abs().amax() > 1e-4


def test_gradients_reach_every_parameter():
    cfg = CFG.model_copy(update=dict(dropout=0.1))
    model = seeded(HibertForPretraining, cfg).train()
    model(make_pretrain_batch(*masked_batch_inputs(random_docs(8, n_docs=4)))).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    batch = make_pretrain_batch(*masked_batch_inputs(random_docs(9)))
    plain = seeded(HibertForPretraining).train()
    ckpt = HibertForPretraining(CFG.model_copy(update=dict(activation_checkpointing=True))).train()
    ckpt.load_state_dict(plain.state_dict())
    losses = []
    for model in (plain, ckpt):
        loss = model(batch).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1])
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_runs_under_bf16_autocast():
    batch = make_pretrain_batch(*masked_batch_inputs(random_docs(10, n_docs=4)))
    model = seeded(HibertForPretraining).train()
    with torch.no_grad():
        fp32 = model.eval()(batch).loss
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(out.nll_sum)
    assert abs(out.loss.item() - fp32.item()) < 0.05 * fp32.item()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@torch.no_grad()
def test_label_smoothing_changes_the_loss_not_the_nll():
    batch = make_pretrain_batch(*masked_batch_inputs(random_docs(11)))
    model = seeded(HibertForPretraining).eval()
    plain = model(batch, return_logits=True)
    smoothed = model(batch, label_smoothing=0.1)
    assert not torch.isclose(plain.loss, smoothed.loss)
    torch.testing.assert_close(plain.nll_sum, smoothed.nll_sum)
    expected = F.cross_entropy(plain.logits, batch.dec_labels, label_smoothing=0.1)
    torch.testing.assert_close(smoothed.loss, expected)
    model.label_smoothing = 0.1  # the constructor argument's attribute is the default
    torch.testing.assert_close(model(batch).loss, expected)


def test_batch_without_targets_gives_a_zero_loss():
    docs = random_docs(12)
    model = seeded(HibertForPretraining)
    out = model(make_pretrain_batch(docs, [[] for _ in docs], [[] for _ in docs]))
    out.loss.backward()
    assert out.loss.item() == 0 and out.num_target_tokens == 0


@torch.no_grad()
def test_pre_ln_gelu_untied_variant_is_layout_invariant():
    cfg = CFG.model_copy(update=dict(norm_first=True, activation="gelu", tie_output_embeddings=False,
                                     decoder_layers=1))
    model = seeded(HibertForPretraining, cfg).eval()
    assert model.output_weight() is not model.encoder.token_embedding.weight
    inputs = masked_batch_inputs(random_docs(13))
    torch.testing.assert_close(model(make_pretrain_batch(*inputs)).loss,
                               model(make_padded_pretrain_batch(*inputs)).loss, atol=1e-5, rtol=1e-5)


def test_positions_beyond_the_table_are_refused():
    enc = HibertEncoder(CFG.model_copy(update=dict(max_positions=8)))
    with pytest.raises(ValueError, match="max_positions"):
        enc(pack_documents([[list(range(6, 20))]]))


@pytest.mark.parametrize("num_labels", [2, "sigmoid"])
def test_extractive_head_shapes_and_encoder_transfer(num_labels):
    pre = seeded(HibertForPretraining)
    ext = HibertExtractive(CFG, num_labels).eval()
    ext.encoder.load_state_dict(pre.encoder.state_dict())  # same keys, nothing left over
    docs = pack_documents(random_docs(14))
    with torch.no_grad():
        logits = ext(docs)
        torch.testing.assert_close(ext.head(pre.eval().encoder(docs).sentence_states).squeeze(-1)
                                   if num_labels == "sigmoid" else ext.head(pre.encoder(docs).sentence_states), logits)
    assert logits.shape == ((docs.num_sentences, 2) if num_labels == 2 else (docs.num_sentences,))


def test_extractive_loss_ignores_empty_rows_of_the_padded_layout():
    docs = random_docs(15)
    ext = seeded(HibertExtractive).eval()
    packed, padded = pack_documents(docs), pad_documents(docs)
    labels = torch.arange(packed.num_sentences) % 2
    padded_labels = torch.full((padded.tokens.shape[0],), -100)
    padded_labels[padded.real_rows()] = labels
    with torch.no_grad():
        torch.testing.assert_close(ext.loss(ext(packed), labels), ext.loss(ext(padded), padded_labels))


@pytest.mark.parametrize("num_labels", [2, "sigmoid"])
def test_extractive_loss_falls_on_a_toy_problem(num_labels):
    """Label a sentence 1 when it contains token 7: a few Adam steps must learn it."""
    rng = np.random.default_rng(0)
    docs = [[rng.integers(8, CFG.vocab_size, rng.integers(2, 7)) for _ in range(5)] for _ in range(8)]
    for d in docs:
        for s in d[:: 2]:
            s[rng.integers(len(s))] = 7
    batch = pack_documents(docs)
    labels = torch.tensor([int(7 in s) for d in docs for s in d])
    model = seeded(HibertExtractive, CFG, num_labels).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss = model.loss(model(batch), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
