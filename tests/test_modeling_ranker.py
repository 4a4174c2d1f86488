"""The paragraph ranker (modeling/ranker.py) on tiny configs: its losses against hand computations, the
budgeted selection, strict loading of registered encoders, pooling, and independence from the batch."""
import math

import numpy as np
import pytest
import torch

from hibert.config.abstractive import DecoderConfig
from hibert.config.model import ModelConfig
from hibert.modeling.abstractive import HibertAbstractive
from hibert.modeling.clusters import pack_clusters
from hibert.modeling.extractive import HibertExtractive
from hibert.modeling.packing import pack_documents
from hibert.modeling.ranker import HibertRanker, ranker_input, ranker_loss, select_units

ENC = ModelConfig(name="t", hidden=32, layers=1, heads=2, vocab_size=64, dropout=0.0, max_positions=64)


def _clusters(seed: int, n: int = 3) -> list:
    rng = np.random.default_rng(seed)
    unit = lambda: [rng.integers(6, 64, rng.integers(1, 6)) for _ in range(rng.integers(1, 4))]  # noqa: E731
    return [[unit() for _ in range(rng.integers(1, 5))] for _ in range(n)]


def _layout(sizes: list[int]):
    """The layout of clusters of `sizes` one-word units (the loss reads only which cluster a unit is in)."""
    return pack_clusters([[[[6]] for _ in range(n)] for n in sizes]).layout


def _bce(s: float, y: float) -> float:
    p = 1 / (1 + math.exp(-s))
    return -(y * math.log(p) + (1 - y) * math.log(1 - p))


# ---------------------------------------------------------------------------------------------- losses
def test_listwise_loss_and_its_gradient_by_hand_on_two_clusters():
    layout = _layout([2, 3, 2])
    scores = torch.tensor([1.0, 0.0, 0.5, -0.5, 0.0, 2.0, -1.0], requires_grad=True)
    labels = torch.tensor([0.3, 0.1, 0.0, 0.2, 0.2, 0.0, 0.0])  # the third cluster has no ranking: left out
    loss, n = ranker_loss(scores, labels, layout, "listwise")
    lse0 = math.log(math.e + 1)
    lse1 = math.log(math.exp(0.5) + math.exp(-0.5) + 1)
    want0 = -(0.75 * (1.0 - lse0) + 0.25 * (0.0 - lse0))
    want1 = -(0.5 * (-0.5 - lse1) + 0.5 * (0.0 - lse1))
    assert n == 2 and loss.item() == pytest.approx((want0 + want1) / 2, rel=1e-6)
    # d/ds = (softmax within the cluster - normalised labels) / clusters counted; 0 for the skipped cluster
    loss.backward()
    soft0 = torch.softmax(torch.tensor([1.0, 0.0]), 0) - torch.tensor([0.75, 0.25])
    soft1 = torch.softmax(torch.tensor([0.5, -0.5, 0.0]), 0) - torch.tensor([0.0, 0.5, 0.5])
    torch.testing.assert_close(scores.grad, torch.cat([soft0, soft1, torch.zeros(2)]) / 2)


def test_listwise_loss_without_any_ranking_signal_counts_nothing():
    scores = torch.randn(3, requires_grad=True)
    loss, n = ranker_loss(scores, torch.zeros(3), _layout([1, 2]), "listwise")
    assert n == 0 and loss.item() == 0.0
    loss.backward()
    assert torch.equal(scores.grad, torch.zeros(3))


def test_regression_loss_by_hand_on_two_clusters():
    layout = _layout([2, 3])
    scores = torch.tensor([1.0, 0.0, 0.5, -0.5, 0.0])
    labels = torch.tensor([0.3, 0.1, 0.0, 0.0, 0.4])
    loss, n = ranker_loss(scores, labels, layout, "regression")
    # BCE of sigmoid(score) against the soft ROUGE-2 recall label, mean per cluster, then over clusters
    want = ((_bce(1.0, 0.3) + _bce(0.0, 0.1)) / 2 + (_bce(0.5, 0.0) + _bce(-0.5, 0.0) + _bce(0.0, 0.4)) / 3) / 2
    assert n == 2 and loss.item() == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="listwise or regression"):
        ranker_loss(scores, labels, layout, "pairwise")


# ---------------------------------------------------------------------------------------------- selection
def test_select_units_keeps_the_best_prefix_of_the_ranking_that_fits_the_budget():
    scores = np.array([0.1, 0.9, 0.5, 0.9])
    tokens = np.array([10, 30, 20, 5])
    # rank order: descending score, ties in document order -> 1, 3, 2, 0 (cumulative tokens 30, 35, 55, 65)
    assert select_units(scores, tokens, 1000).tolist() == [1, 3, 2, 0]
    assert select_units(scores, tokens, 55).tolist() == [1, 3, 2]
    assert select_units(scores, tokens, 54).tolist() == [1, 3]  # a prefix: unit 0 would fit but ranks lower
    assert select_units(scores, tokens, 1000, top=2).tolist() == [1, 3]
    assert select_units(scores, tokens, 5).tolist() == [1]      # the best unit is always kept


# ---------------------------------------------------------------------------------------------- model
def test_ranker_loads_registered_encoders_strictly():
    from hibert.runtime.export import load_encoder

    torch.manual_seed(0)
    ranker = HibertRanker(ENC)
    ext = HibertExtractive(ENC)
    abst = HibertAbstractive(ENC, DecoderConfig(layers=1, max_positions=64))
    keys = lambda m: {k for k in m.state_dict() if k.startswith("encoder.")}  # noqa: E731
    assert keys(ranker) == keys(ext) == keys(abst)
    for source in (ext, abst):
        ranker.encoder.load_state_dict(source.encoder.state_dict(), strict=True)
        load_encoder(ranker.encoder, source.encoder.state_dict())  # the registry's loader
        for name, value in ranker.encoder.state_dict().items():
            assert torch.equal(value, source.encoder.state_dict()[name])
    # the whole ranker = registered encoder + its own (non-encoder) head
    head = {k: v for k, v in ranker.state_dict().items() if not k.startswith("encoder.")}
    ranker.load_state_dict({**{f"encoder.{k}": v for k, v in ext.encoder.state_dict().items()}, **head}, strict=True)
    assert head and all(not k.startswith("encoder.") for k in head)


TITLES = [[np.array([20, 21, 22])], None, [np.array([23])], None]   # two clusters with a title, two without


@pytest.mark.parametrize("pool", ["title", "mean", "attention"])
def test_a_clusters_scores_do_not_depend_on_the_other_clusters(pool):
    torch.manual_seed(0)
    ranker = HibertRanker(ENC, pool).eval()
    clusters = _clusters(4, n=4)
    with torch.no_grad():
        together = ranker(ranker_input(clusters, TITLES))
        alone = torch.cat([ranker(ranker_input([c], [t])) for c, t in zip(clusters, TITLES)])
        reversed_batch = ranker(ranker_input(clusters[::-1], TITLES[::-1]))
    assert together.shape == (sum(len(c) for c in clusters),)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    sizes = [len(c) for c in clusters]
    parts = torch.split(reversed_batch, sizes[::-1])
    torch.testing.assert_close(torch.cat(parts[::-1]), together, atol=1e-5, rtol=1e-5)


def test_pooling_is_a_mean_or_a_distribution_over_each_units_sentences():
    torch.manual_seed(0)
    clusters = [[[[6, 7], [8, 9, 10]], [[11]]], [[[12, 13], [14], [15, 16]]]]
    units = pack_clusters(clusters).units
    mean, attn = HibertRanker(ENC, "mean").eval(), HibertRanker(ENC, "attention").eval()
    attn.encoder.load_state_dict(mean.encoder.state_dict())
    with torch.no_grad():
        states = mean.encoder(units).sentence_states
        want = torch.stack([states[0:2].mean(0), states[2], states[3:6].mean(0)])
        torch.testing.assert_close(mean.unit_vectors(units), want)
        got = attn.unit_vectors(units)
        torch.testing.assert_close(got[1], states[2])  # one sentence: all the weight
        # a convex combination of its sentences: inside the span, not their mean (learned scores)
        w = torch.linalg.lstsq(states[0:2].T, got[0][:, None]).solution.squeeze(1)
        assert w.sum().item() == pytest.approx(1.0, abs=1e-4) and (w > 0).all()
    with pytest.raises(ValueError, match="pool"):
        HibertRanker(ENC, "max")


def test_title_pool_is_liu_lapata_eq_1_to_6_by_hand():
    """u = token state + its sentence's document-level vector (the encoder over the unit, eq. 2; over the title,
    eq. 1); û_t = max over the title's tokens (eq. 3); p_i = tanh(W_1 [u_pi; û_t]) (eq. 4); p̂ = max over the
    unit's tokens (eq. 5); score = head(p̂) (eq. 6 before the sigmoid). Without a title: û_t = the mean over
    the cluster's units of their max-pooled token vectors (the centroid)."""
    torch.manual_seed(1)
    ranker = HibertRanker(ENC, "title").eval()
    clusters = [[[[6, 7], [8, 9, 10]], [[11, 12]]], [[[13, 14], [15]], [[16]], [[17, 18, 19]]]]
    titles = [[np.array([20, 21])], None]

    def tokens(doc):                          # [n, H] u vectors of one document through the encoder
        packed = pack_documents([doc])
        enc = ranker.encoder(packed)
        rows = torch.repeat_interleave(torch.arange(packed.tokens.shape[0]), packed.sent_lens)
        return enc.token_flat + enc.sentence_states[rows]

    with torch.no_grad():
        got = ranker(ranker_input(clusters, titles))
        want = []
        for c, t in zip(clusters, titles):
            units = [tokens(u) for u in c]
            cond = tokens(t).max(0).values if t is not None else torch.stack([u.max(0).values for u in units]).mean(0)
            for u in units:
                p = torch.tanh(ranker.match(torch.cat([u, cond.expand_as(u)], -1)))
                want.append(ranker.head(p.max(0).values))
        torch.testing.assert_close(got, torch.cat(want), atol=1e-5, rtol=1e-5)
        # the title matters where there is one, not elsewhere
        other = ranker(ranker_input(clusters, [[np.array([30, 31, 32])], None]))
    assert not torch.allclose(other[:2], got[:2]) and torch.allclose(other[2:], got[2:])
    with pytest.raises(ValueError, match="RankerInput"):
        ranker(pack_clusters(clusters).units)
