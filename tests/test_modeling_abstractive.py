"""Abstractive head (modeling/abstractive.py and its parts) on tiny configs (CPU): teacher forcing vs incremental decoding,
Ma & Zong's PHT/VHT cross-attention and the pointer-generator mixture against hand computations,
padding-freeness, weight compatibility with the pretraining encoder/decoder."""
import math
import sys

import numpy as np
import pytest
import torch

from conftest import REPO
from hibert.config.abstractive import DecoderConfig, GenerationConfig
from hibert.config.model import ModelConfig
from hibert.finetune.abstractive.data import make_abstractive_batch
from hibert.tokens import BOS_ID, EOS_ID, PAD_ID, SEP_ID
from hibert.modeling import HibertExtractive, HibertForPretraining
from hibert.modeling.abstractive import HibertAbstractive
from hibert.modeling.cross_attention import (ParallelCrossAttention, VerticalCrossAttention, coverage_loss,
                                             segment_softmax)
from hibert.modeling.decoder import QueryLayout, copy_mixture
from hibert.modeling.packing import pack_documents
from hibert.modeling.source_memory import source_memory

sys.path.insert(0, str(REPO / "benchmarks"))  # the no-cache reference decoder is the benchmark's
from recompute_decode import decode_prefix  # noqa: E402

V = 64
CFG = ModelConfig(name="test", vocab_size=V, hidden=32, layers=2, heads=2, dropout=0.0, max_positions=64)
VARIANTS = [("flat", False, False), ("flat", True, True), ("pht", False, True), ("pht", True, False),
            ("vht", False, False), ("vht", True, True)]  # (cross_attention, copy, norm_first)


def random_docs(seed: int, n_docs: int = 3, max_sents: int = 5, max_words: int = 9) -> list:
    rng = np.random.default_rng(seed)
    return [[rng.integers(6, V, rng.integers(0, max_words + 1)) for _ in range(rng.integers(1, max_sents + 1))]
            for _ in range(n_docs)]


def random_targets(seed: int, n: int, max_len: int = 10) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, V, rng.integers(0, max_len + 1)) for _ in range(n)]


def tiny_model(cross: str = "flat", copy: bool | str = False, norm_first: bool = False, seed: int = 0, **kw):
    """copy="coverage": copy with See et al.'s coverage, its per-head weights set away from their zero start."""
    torch.manual_seed(seed)
    coverage = copy == "coverage"
    dec = DecoderConfig(**{"layers": 2, "dropout": 0.0, "cross_attention": cross, "copy": bool(copy),
                           "coverage": coverage, "norm_first": norm_first, "max_positions": 64, **kw})
    model = HibertAbstractive(CFG, dec).eval()
    if coverage:
        with torch.no_grad():
            model.decoder.layers[-1].cross.coverage.copy_(torch.tensor([2.0, -3.0]))
    return model


@torch.no_grad()
def favour_eos(model: HibertAbstractive, strength: float = 3.0) -> HibertAbstractive:
    """Make EOS likely (random weights almost never end): the decoder's last LayerNorm gets a bias along a
    random unit direction u and the (tied) EOS embedding becomes u, so EOS's logit is about `strength`
    above what it would be for a random word (~N(0, 1) logits)."""
    d = model.decoder
    last = d.final_norm if model.dec_cfg.norm_first else d.layers[-1].ffn_norm
    u = torch.randn(CFG.hidden, generator=torch.Generator().manual_seed(123))
    u /= u.norm()
    last.bias += strength * u
    model.output_weight()[EOS_ID] = u
    return model


# ---------------------------------------------------------------------------------------------- batch
def test_batch_layout_teacher_forcing_fields():
    docs = random_docs(0, n_docs=2)
    targets = [np.array([7, SEP_ID, 9]), np.array([], dtype=np.int64)]
    b = make_abstractive_batch(docs, targets)
    assert b.dec_tokens.tolist() == [BOS_ID, 7, SEP_ID, 9, BOS_ID]
    assert b.dec_labels.tolist() == [7, SEP_ID, 9, EOS_ID, EOS_ID]
    assert b.dec_pos.tolist() == [0, 1, 2, 3, 0] and b.dec_doc.tolist() == [0, 0, 0, 0, 1]
    assert b.target_lens.tolist() == [4, 1] and b.num_target_tokens == 5 and b.max_target_len == 8
    assert b.dec_index.tolist() == [0, 1, 2, 3, 8] and b.dec_cu.tolist() == [0, 4, 5]
    with pytest.raises(ValueError):
        make_abstractive_batch(docs, targets[:1])


def test_source_memory_is_the_flat_stream_of_real_tokens_with_sentence_vectors():
    docs = random_docs(1)
    model = tiny_model()
    packed = pack_documents(docs)
    with torch.no_grad():
        enc = model.encoder(packed)
        mem = source_memory(enc, add_sentence_vectors=True)
        plain = source_memory(enc, add_sentence_vectors=False)
    n_tokens = [sum(len(s) + 1 for s in d) for d in docs]
    assert mem.key_mask.sum(1).tolist() == n_tokens
    # stream order: document 0's tokens, sentence by sentence, then document 1's ...
    ids = [int(t) for d in docs for s in d for t in list(s) + [SEP_ID]]  # copy targets: a sentence end is SEP
    assert mem.ids[mem.key_mask].tolist() == ids and (mem.ids[~mem.key_mask] == PAD_ID).all()
    rows = torch.repeat_interleave(torch.arange(packed.num_sentences), packed.sent_lens)
    torch.testing.assert_close(mem.states, plain.states + enc.sentence_states[rows])
    seg = [j for d in docs for j, s in enumerate(d) for _ in range(len(s) + 1)]
    assert mem.segment[mem.key_mask].tolist() == seg
    real = mem.token_mask & mem.sentence_mask[:, :, None]  # padding sentences keep one (zero) key
    assert mem.grid_ids[real.flatten(1)].tolist() == ids


# ---------------------------------------------------------------------------------------------- incremental
def _teacher_forced(model, docs, targets):
    batch = make_abstractive_batch(docs, targets)
    with torch.no_grad():
        out = model(batch, return_log_probs=True)
    return batch, out.log_probs


@pytest.mark.parametrize("cross,copy,norm_first", VARIANTS + [("flat", "coverage", False)])
def test_cached_decoding_equals_teacher_forcing(cross, copy, norm_first):
    """K=2 beams per document (two different targets each): every step's log-probs from the KV cache
    (beams folded into cross-attention's query axis) equal the teacher-forced forward, and so does the
    no-cache prefix recomputation."""
    docs = random_docs(2, n_docs=3)
    model = tiny_model(cross, copy, norm_first)
    targets = random_targets(3, 6)
    # teacher forcing on documents repeated per beam: row b*2+j <-> batch entry b*2+j
    batch, ref = _teacher_forced(model, [d for d in docs for _ in range(2)], targets)
    steps = int(batch.target_lens.max())
    inputs = torch.full((6, steps), BOS_ID)
    for r, t in enumerate(targets):
        inputs[r, 1:len(t) + 1] = torch.as_tensor(t)
    start = batch.dec_cu.long()
    with torch.no_grad():
        state = model.start_decoding(pack_documents(docs), beams=2, max_len=steps)
        assert state.memory[0].keys.shape[0] == 3 and state.cache.rows == 6  # memory never tiled over beams
        worst = worst_prefix = 0.0
        for t in range(steps):
            step = model.decode_step(inputs[:, t], state)
            prefix = decode_prefix(model, inputs[:, : t + 1], state.memory)
            for r in range(6):
                if t < batch.target_lens[r]:
                    worst = max(worst, (step[r] - ref[start[r] + t]).abs().max().item())
                    worst_prefix = max(worst_prefix, (prefix[r] - ref[start[r] + t]).abs().max().item())
    assert worst < 1e-5 and worst_prefix < 1e-5


@pytest.mark.parametrize("cross,copy,norm_first", VARIANTS[::2] + [("pht", True, False), ("flat", "coverage", True)])
def test_kv_cache_reorder_follows_backpointers(cross, copy, norm_first):
    """After `reorder(rows)` (beam backpointers + a dropped document) the cache continues exactly like a
    fresh decode of the reordered prefixes."""
    docs = random_docs(4, n_docs=2)
    model = tiny_model(cross, copy, norm_first)
    rng = np.random.default_rng(0)
    prefixes = torch.as_tensor(rng.integers(6, V, (4, 5)))
    prefixes[:, 0] = BOS_ID
    with torch.no_grad():
        state = model.start_decoding(pack_documents(docs), beams=2, max_len=8)
        for t in range(4):
            model.decode_step(prefixes[:, t], state)
        rows = torch.tensor([3, 2])  # document 0 is done; document 1's beams swap
        state.reorder(rows, keep_docs=torch.tensor([1]))
        got = model.decode_step(prefixes[rows, 4], state)
        fresh = model.start_decoding(pack_documents(docs[1:]), beams=2, max_len=8)
        for t in range(5):
            want = model.decode_step(prefixes[rows, t], fresh)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)



def test_kv_cache_follows_many_reorders_without_moving_entries():
    """Beam search hands beams each other's prefixes at every step and drops finished documents: the cache
    (each hypothesis attends over its document's entries under its ancestry) continues exactly like a fresh
    decode of every hypothesis' own token history. K=3 beams, 3 documents, random backpointers within each
    document for 6 steps, the middle document dropped after step 3."""
    docs = random_docs(8, n_docs=3)
    model = tiny_model()
    rng = np.random.default_rng(1)
    k, steps = 3, 6
    history = torch.full((9, 1), BOS_ID)
    keep = torch.arange(3)
    with torch.no_grad():
        state = model.start_decoding(pack_documents(docs), beams=k, max_len=steps + 1)
        for t in range(steps):
            got = model.decode_step(history[:, -1], state)
            fresh = model.start_decoding(pack_documents([docs[i] for i in keep.tolist()]), beams=k, max_len=steps + 1)
            for j in range(t + 1):
                want = model.decode_step(history[:, j], fresh)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            b = len(keep)
            rows = (torch.arange(b)[:, None] * k + torch.as_tensor(rng.integers(0, k, (b, k)))).flatten()
            history = torch.cat([history[rows], torch.as_tensor(rng.integers(6, V, (b * k, 1)))], 1)
            if t == 2:  # the middle document is done
                kept = torch.tensor([0, 2])
                rows = rows.view(b, k)[kept].flatten()
                history = history.view(b, k, -1)[kept].flatten(0, 1)
                state.reorder(rows, keep_docs=kept)
                keep = keep[kept]
            else:
                state.reorder(rows)
        crossing = torch.arange(6)
        crossing[3] = 0  # document 1's hypothesis continuing one of document 0's: its mask would be meaningless
        with pytest.raises(ValueError, match="its own document"):
            state.reorder(crossing)


# ---------------------------------------------------------------------------------------------- PHT / VHT
def _memory_and_queries(seed: int = 5):
    docs = random_docs(seed, n_docs=2, max_sents=4, max_words=6)
    model = tiny_model()
    with torch.no_grad():
        mem = source_memory(model.encoder(pack_documents(docs)), add_sentence_vectors=True)
    x = torch.randn(2, 3, CFG.hidden, generator=torch.Generator().manual_seed(seed))
    return docs, mem, x


def _mha(x: torch.Tensor, keys: torch.Tensor, q_lin, kv_lin, out_lin, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-head attention of queries x [Q, H] over keys [L, H], literally: (output [Q, H], weights [h, Q, L])."""
    h = x.shape[-1]
    d = h // heads
    q = q_lin(x).view(-1, heads, d).transpose(0, 1)
    k, v = kv_lin(keys).split(h, dim=-1)
    k, v = k.view(-1, heads, d).transpose(0, 1), v.view(-1, heads, d).transpose(0, 1)
    w = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1)
    return out_lin((w @ v).transpose(0, 1).reshape(-1, h)), w


def _sentences(docs, mem, b: int) -> list[torch.Tensor]:
    """Memory rows of each sentence of document b, in order."""
    states = mem.states.new_zeros(mem.key_mask.numel(), mem.states.shape[1]).index_copy(0, mem.slot, mem.states)
    states = states.view(*mem.key_mask.shape, -1)[b]
    bounds = np.cumsum([0] + [len(s) + 1 for s in docs[b]])
    return [states[bounds[j]:bounds[j + 1]] for j in range(len(docs[b]))]


def test_segment_softmax_hand_case():
    scores = torch.tensor([[[[1.0, 2.0, 3.0, 0.0, 0.0, -math.inf]]]])
    seg = torch.tensor([[0, 0, 0, 1, 1, 0]])
    e = np.exp([1.0, 2.0, 3.0])
    want = list(e / e.sum()) + [0.5, 0.5, 0.0]
    torch.testing.assert_close(segment_softmax(scores, seg, 2)[0, 0, 0], torch.tensor(want, dtype=torch.float32))
    far = torch.tensor([[[[0.0, -200.0, -201.0]]]])  # a sentence far below the other must not underflow
    want = torch.tensor([1.0, 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))])
    torch.testing.assert_close(segment_softmax(far.clone(), torch.tensor([[0, 1, 1]]), 2)[0, 0, 0], want)
    # the autograd path (always the per-segment shift) and the weighted form agree
    weights = torch.tensor([[[[0.25, 0.75]]]])
    got = segment_softmax(far.clone().requires_grad_(), torch.tensor([[0, 1, 1]]), 2, weights)
    torch.testing.assert_close(got.detach()[0, 0, 0], want * torch.tensor([0.25, 0.75, 0.75]))


@torch.no_grad()
def test_pht_equals_eq_7_to_10_computed_per_sentence():
    """PHT's one-matmul computation against Ma & Zong eq. 7-10 written out: eq. 8 once per sentence,
    eq. 7 over the sentence vectors + R, A^para the head mean, eq. 9 the A^para-weighted sum."""
    docs, mem, x = _memory_and_queries()
    torch.manual_seed(1)
    pht = ParallelCrossAttention(CFG.model_copy(update={"heads": 2}))
    cache = pht.prepare(mem)
    context, token_p = pht(x, cache, want_attention=True)
    per_head, _ = pht.distributions(x, cache)
    for b in range(2):
        sents = _sentences(docs, mem, b)
        d = len(sents)
        phi = mem.sentences[b, :d] + mem.rank[:d]                                 # eq. 6
        x_para, a_heads = _mha(x[b], phi, pht.sent_q, pht.sent_kv, pht.sent_out, 2)  # eq. 7
        a_para = a_heads.mean(0)                                                  # [Q, D], footnote 5
        words = [_mha(x[b], c, pht.q, pht.kv, pht.out, 2) for c in sents]         # eq. 8 per sentence
        x_int = sum(a_para[:, p, None] * words[p][0] for p in range(d))           # eq. 9
        torch.testing.assert_close(context[b], x_para + x_int, atol=1e-5, rtol=1e-5)  # eq. 10's sum
        want_p = torch.cat([a_para[:, p, None] * words[p][1].mean(0) for p in range(d)], dim=1)
        n = want_p.shape[1]
        torch.testing.assert_close(token_p[b, :, :n], want_p, atol=1e-6, rtol=1e-5)
        assert (token_p[b, :, n:] == 0).all()
    # an exact distribution over each document's tokens: per head and averaged
    torch.testing.assert_close(per_head.sum(-1), torch.ones(2, 2, 3))
    torch.testing.assert_close(token_p.sum(-1), torch.ones(2, 3))


@torch.no_grad()
def test_vht_equals_eq_11_to_13_computed_per_sentence():
    """VHT: a word-level context vector per sentence (eq. 8), + R (eq. 11), then attention over those
    dynamic sentence vectors (eq. 12) is the whole cross-attention output (eq. 13)."""
    docs, mem, x = _memory_and_queries(6)
    torch.manual_seed(2)
    vht = VerticalCrossAttention(CFG)
    context, token_p = vht(x, vht.prepare(mem), want_attention=True)
    for b in range(2):
        sents = _sentences(docs, mem, b)
        d = len(sents)
        words = [_mha(x[b], c, vht.q, vht.kv, vht.out, CFG.heads) for c in sents]
        for q in range(3):
            dyn = torch.stack([w[0][q] for w in words]) + mem.rank[:d]           # eq. 11: [D, H]
            out, beta = _mha(x[b, q:q + 1], dyn, vht.sent_q, vht.sent_kv, vht.sent_out, CFG.heads)  # eq. 12
            torch.testing.assert_close(context[b, q], out[0], atol=1e-5, rtol=1e-5)
            want_p = torch.cat([beta.mean(0)[0, p] * words[p][1].mean(0)[q] for p in range(d)])
            got = token_p[b, q].view(mem.token_mask.shape[1], -1)[:d]
            got = torch.cat([got[p, : len(sents[p])] for p in range(d)])
            torch.testing.assert_close(got, want_p, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(token_p.sum(-1), torch.ones(2, 3))


def test_vht_fused_projection_follows_weight_updates_while_decoding():
    """Without gradients VHT keeps sent_kv.W @ out.W between calls; an in-place update of either weight (an
    optimizer step, load_state_dict) must be seen by the next call."""
    _, mem, x = _memory_and_queries(6)
    torch.manual_seed(3)
    vht = VerticalCrossAttention(CFG)
    with torch.no_grad():
        vht(x, vht.prepare(mem))
        for weight in (vht.out.weight, vht.sent_kv.weight):
            weight.mul_(1.5)
            got = vht(x, vht.prepare(mem))[0]
            with torch.enable_grad():
                want = vht(x, vht.prepare(mem))[0]   # recomputed from the weights as they are
            torch.testing.assert_close(got, want, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------- copy
def test_copy_mixture_hand_case():
    """p(w) = p_gen p_vocab(w) + (1 - p_gen) sum_{i: src_i = w} a_i, on a 6-word vocabulary."""
    p_vocab = torch.tensor([[0.1, 0.1, 0.2, 0.2, 0.3, 0.1]])
    a = torch.tensor([[0.5, 0.3, 0.2, 0.0]])          # last slot is padding
    ids = torch.tensor([[4, 5, 4, PAD_ID]])
    g = torch.tensor([[0.4]])
    p_gen = 1 / (1 + math.exp(-0.4))
    got = copy_mixture(p_vocab.log(), g, a, QueryLayout(1, 1), ids).exp()[0]
    want = p_gen * p_vocab[0]
    want[4] += (1 - p_gen) * 0.7
    want[5] += (1 - p_gen) * 0.3
    torch.testing.assert_close(got, want)
    assert abs(got.sum().item() - 1) < 1e-6


@pytest.mark.parametrize("cross", ["flat", "pht", "vht"])
def test_copy_model_is_a_distribution_and_copies_the_document(cross):
    docs, targets = random_docs(7), random_targets(8, 3)
    model = tiny_model(cross, copy=True)
    _, logp = _teacher_forced(model, docs, targets)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(logp.shape[0]), atol=1e-5, rtol=0)
    with torch.no_grad():
        model.decoder.copy_gate.bias.fill_(-40.0)  # p_gen ~ 0: all mass on the document's own tokens
    batch, logp = _teacher_forced(model, docs, targets)
    for r in range(logp.shape[0]):
        doc = batch.dec_doc[r].item()
        source = sorted({int(t) for s in docs[doc] for t in list(s) + [SEP_ID]})  # a sentence end copies as SEP
        assert logp[r, source].exp().sum().item() > 1 - 1e-4
        assert logp[r, EOS_ID].exp().item() < 1e-12  # copying never ends the summary


def test_copy_attention_sink_on_sentence_ends_votes_for_sep_not_eos():
    """Regression: HIBERT's sentence-final EOS positions hold the sentence vectors and attract attention; with
    all attention on them and p_gen ~ 0, the copy distribution must put its mass on SEP (a sentence break),
    none on EOS (the end of the summary)."""
    docs = random_docs(3)
    model = tiny_model("flat", copy=True)
    packed = pack_documents(docs)
    with torch.no_grad():
        mem = source_memory(model.encoder(packed), add_sentence_vectors=True)
    assert not bool((mem.ids == EOS_ID).any())
    ends = torch.zeros_like(mem.key_mask)
    for b, doc in enumerate(docs):                      # the slot of every sentence's last token (its EOS)
        ends[b, (np.cumsum([len(s) + 1 for s in doc]) - 1).tolist()] = True
    assert bool((mem.ids[ends] == SEP_ID).all())
    attn = ends.float() / ends.sum(1, keepdim=True)     # the sink: all attention on sentence ends
    logp_vocab = torch.full((len(docs), V), -math.log(V))
    p = copy_mixture(logp_vocab, torch.full((len(docs), 1), -40.0), attn, QueryLayout(len(docs), 1), mem.ids).exp()
    torch.testing.assert_close(p[:, SEP_ID], torch.ones(len(docs)), atol=1e-6, rtol=0)
    assert float(p[:, EOS_ID].max()) < 1e-12


def test_copy_loss_gradients_are_finite_and_smoothing_matches_its_formula():
    """Labels absent from the source (copy probability 0, log = -inf before mixing) keep finite
    gradients; the smoothed loss is (1 - eps) NLL + eps mean_V(-log p) of the mixture."""
    docs = random_docs(9)
    targets = [np.array([60, 61, 62]), np.array([63]), np.array([], dtype=np.int64)]
    model = tiny_model("pht", copy=True).train()
    batch = make_abstractive_batch(docs, targets)
    out = model(batch, label_smoothing=0.1, return_log_probs=True)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.encoder.token_embedding.weight.grad.abs().sum() > 0  # the tied table learns from both sides
    logp = out.log_probs.detach()
    nll = -logp.gather(1, batch.dec_labels[:, None]).squeeze(1)
    assert torch.isclose(out.nll_sum, nll.sum())
    want = ((0.9 * nll - 0.1 * logp.mean(-1)).sum() / batch.num_target_tokens)
    assert torch.isclose(out.loss.detach(), want, atol=1e-5)
    assert out.num_target_tokens == 3 + 1 + 1 + 1 + 1 + 0  # subwords + EOS of each target


# ---------------------------------------------------------------------------------------------- padding-free
@pytest.mark.parametrize("cross,copy,norm_first", VARIANTS)
def test_a_document_does_not_depend_on_the_rest_of_the_batch(cross, copy, norm_first):
    model = tiny_model(cross, copy, norm_first)
    doc, target = random_docs(10, n_docs=1), random_targets(11, 1, max_len=6)
    others = random_docs(12, n_docs=3, max_sents=8, max_words=20)   # wider grids at every level
    other_targets = random_targets(13, 3, max_len=20)
    _, alone = _teacher_forced(model, doc, target)
    batch, mixed = _teacher_forced(model, others[:1] + doc + others[1:], other_targets[:1] + target + other_targets[1:])
    torch.testing.assert_close(mixed[batch.dec_doc == 1], alone, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # per-document NLL, through the loss path
        nll_alone = model(make_abstractive_batch(doc, target)).nll_sum
    labels = batch.dec_labels[batch.dec_doc == 1]
    assert torch.isclose(-mixed[batch.dec_doc == 1].gather(1, labels[:, None]).sum(), nll_alone, atol=1e-4)


# ---------------------------------------------------------------------------------------------- weights
def test_encoder_keys_equal_the_pretraining_and_extractive_encoders():
    model = tiny_model("pht", copy=True)
    pre = HibertForPretraining(CFG)
    keys = set(model.encoder.state_dict())
    assert keys == set(pre.encoder.state_dict()) == set(HibertExtractive(CFG).encoder.state_dict())
    model.encoder.load_state_dict(pre.encoder.state_dict(), strict=True)
    # the tied token table is read, not registered a second time; the two groups partition the model
    enc = dict(model.encoder_parameters())
    dec = dict(model.decoder_parameters())
    assert not set(enc) & set(dec) and len(enc) + len(dec) == len(list(model.parameters()))
    assert all(k.startswith("encoder.") for k in enc) and all(k.startswith("decoder.") for k in dec)
    assert not any("token_embedding" in k for k in dec)
    assert model.output_weight() is model.encoder.token_embedding.weight
    untied = tiny_model(tie_input_embeddings=False, tie_output_embeddings=False)
    assert "decoder.token_embedding.weight" in dict(untied.decoder_parameters())
    assert untied.output_weight() is untied.decoder.output.weight


def test_decoder_starts_from_the_pretraining_decoder_where_shapes_match():
    pre = HibertForPretraining(CFG.model_copy(update={"decoder_layers": 1}))
    model = tiny_model()
    before = model.decoder.layers[1].qkv.weight.clone()
    cross_before = model.decoder.layers[0].cross.q.weight.clone()
    loaded = model.load_pretraining_decoder(pre.state_dict())  # full HibertForPretraining keys
    assert "layers.0.qkv.weight" in loaded and "layers.0.ffn_norm.bias" in loaded
    assert not any(".cross." in k or k.startswith("layers.1.") for k in loaded)
    torch.testing.assert_close(model.decoder.layers[0].qkv.weight, pre.decoder.layers.layers[0].qkv.weight)
    torch.testing.assert_close(model.decoder.layers[0].ffn_out.weight, pre.decoder.layers.layers[0].ffn_out.weight)
    assert torch.equal(model.decoder.layers[1].qkv.weight, before)
    assert torch.equal(model.decoder.layers[0].cross.q.weight, cross_before)
    same = model.load_pretraining_decoder({k.removeprefix("decoder."): v for k, v in pre.state_dict().items()
                                           if k.startswith("decoder.")})
    assert same == loaded


def test_bf16_autocast_path_runs_with_fp32_losses_and_mixture():
    """CPU autocast exercises the dtype handling of the CUDA bf16 path: bf16 memory and KV cache,
    fp32 log-probs, a copy mixture that still sums to 1."""
    docs, targets = random_docs(14), random_targets(15, 3)
    model = tiny_model("pht", copy=True)
    batch = make_abstractive_batch(docs, targets)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch, return_log_probs=True)
        state = model.start_decoding(batch.docs, beams=2, max_len=4)
        step = model.decode_step(torch.full((6,), BOS_ID), state)
    assert out.log_probs.dtype == torch.float32 and torch.isfinite(out.loss)
    assert state.memory[0].keys.dtype == torch.bfloat16 and state.cache.kv.dtype == torch.bfloat16
    assert step.dtype == torch.float32
    torch.testing.assert_close(step.exp().sum(-1), torch.ones(6), atol=1e-4, rtol=0)
    ref = model(batch, return_log_probs=True).log_probs
    assert (out.log_probs - ref).abs().max() < 0.1  # bf16 rounding only


def test_config_bounds():
    with pytest.raises(ValueError):
        GenerationConfig(min_length=10, max_length=5)
    with pytest.raises(ValueError):
        GenerationConfig(beam_size=0)
    with pytest.raises(ValueError):
        DecoderConfig(cross_attention="tree")
    assert DecoderConfig.model_validate(DecoderConfig(copy=True).model_dump()).copy is True
    with pytest.raises(ValueError):
        HibertAbstractive(CFG, DecoderConfig(heads=3))  # 3 does not divide hidden 32


# ---------------------------------------------------------------------------------------------- coverage
def test_coverage_attention_is_see_et_al_eq_10_11_by_hand():
    """c^t = sum_{t' < t} a^{t'} (eq. 10) and a^t = mean over heads z of softmax(q^z k^z / sqrt(d) + w_c^z c^t)
    (eq. 11, the dot-product form), recomputed query by query with plain ops."""
    docs, mem, x = _memory_and_queries()
    model = tiny_model("flat", copy="coverage")
    cross = model.decoder.layers[-1].cross
    with torch.no_grad():
        context, attn, cov = cross.attend_with_coverage(x, cross.prepare(mem))
        q = cross.q(x).view(2, 3, 2, 16).transpose(1, 2)                       # [B, h, Q, d]
        k, v = cross.kv(mem.states).chunk(2, -1)
        width = mem.key_mask.shape[1]
        for b in range(2):
            keys = mem.key_mask[b]
            mine = mem.slot // width == b                                         # document b's memory tokens
            kb = torch.zeros(width, CFG.hidden).index_copy(0, mem.slot[mine] % width, k[mine])
            vb = torch.zeros(width, CFG.hidden).index_copy(0, mem.slot[mine] % width, v[mine])
            c = torch.zeros(keys.shape[0])
            for t in range(3):
                torch.testing.assert_close(cov[b, t], c)
                heads = []
                for z in range(2):
                    s = q[b, z, t] @ kb[:, z * 16:(z + 1) * 16].T / 4.0 + cross.coverage[z] * c
                    heads.append(torch.softmax(s.masked_fill(~keys, -math.inf), -1))
                a = torch.stack(heads).mean(0)
                torch.testing.assert_close(attn[b, t], a, atol=1e-6, rtol=1e-5)
                ctx = torch.cat([heads[z] @ vb[:, z * 16:(z + 1) * 16] for z in range(2)])
                torch.testing.assert_close(context[b, t], cross.out(ctx), atol=1e-5, rtol=1e-5)
                c = c + a
        # a coverage given per query (a decoding step) is used as it is
        given = torch.rand(2, 3, mem.key_mask.shape[1])
        _, a2, c2 = cross.attend_with_coverage(x, cross.prepare(mem), before=given)
        assert torch.equal(c2, given) and not torch.allclose(a2, attn)


def test_coverage_loss_hand_case_and_in_the_training_loss():
    """eq. 12: covloss_t = sum_i min(a_i^t, c_i^t); eq. 13: loss = NLL + lambda covloss, per target token."""
    a = torch.tensor([[0.5, 0.3, 0.2]])
    c = torch.tensor([[0.1, 0.6, 0.0]])
    torch.testing.assert_close(coverage_loss(a, c), torch.tensor([0.4]))
    docs, targets = random_docs(7), random_targets(8, 3)
    batch = make_abstractive_batch(docs, targets)
    outs = {}
    for weight in (0.0, 1.0, 2.5):
        model = tiny_model("flat", copy="coverage", coverage_loss_weight=weight)
        with torch.no_grad():
            outs[weight] = model(batch)
    cov = outs[1.0].coverage_loss
    assert cov is not None and float(cov) > 0 and torch.equal(outs[0.0].coverage_loss, cov)
    torch.testing.assert_close(outs[1.0].loss, outs[0.0].loss + cov)
    torch.testing.assert_close(outs[2.5].loss, outs[0.0].loss + 2.5 * cov)
    torch.testing.assert_close(outs[0.0].loss, outs[0.0].nll_sum / batch.num_target_tokens)
    with torch.no_grad():
        assert tiny_model("flat", copy=True)(batch).coverage_loss is None


def test_coverage_needs_flat_copy_attention():
    with pytest.raises(ValueError, match="needs decoder.copy"):
        DecoderConfig(coverage=True)
    with pytest.raises(ValueError, match="flat cross-attention"):
        DecoderConfig(coverage=True, copy=True, cross_attention="pht")
