"""Multi-document modeling on hand-checked cases: matrix-tree marginals against brute-force enumeration of
spanning trees, the global layers (pooling, graph head, padding, batch independence), the cluster memory
against the single-document model, the ranker's losses, and batched decoding of clusters."""
import itertools
import math

import numpy as np
import pytest
import torch

from hibert.config.abstractive import DecoderConfig, GenerationConfig
from hibert.config.mds import MDSConfig
from hibert.config.model import ModelConfig
from modeling.abstractive import HibertAbstractive, make_abstractive_batch, source_memory
from modeling.clusters import pack_clusters, unit_graph
from modeling.generate import generate
from modeling.hierarchical import GlobalEncoder, graph_weights, unit_softmax
from modeling.mds import HibertMDS, make_mds_batch
from modeling.ranker import HibertRanker, ranker_loss, select_units
from modeling.structural import matrix_tree_marginals

ENC = ModelConfig(name="t", hidden=32, layers=1, heads=2, vocab_size=64, dropout=0.0, max_positions=64)


def _brute_force(s: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Edge/root marginals by enumerating every single-root spanning arborescence."""
    n = len(r)
    z, edge, root = 0.0, torch.zeros(n, n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for heads in itertools.product(range(-1, n), repeat=n):
        if any(h == j for j, h in enumerate(heads)) or sum(h == -1 for h in heads) != 1:
            continue
        acyclic = True
        for j in range(n):
            seen, k = set(), j
            while heads[k] != -1 and acyclic:
                acyclic = k not in seen
                seen.add(k)
                k = heads[k]
        if not acyclic:
            continue
        w = math.prod(math.exp(r[j]) if h == -1 else math.exp(s[h, j]) for j, h in enumerate(heads))
        z += w
        for j, h in enumerate(heads):
            if h == -1:
                root[j] += w
            else:
                edge[h, j] += w
    return edge / z, root / z


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_matrix_tree_marginals_equal_brute_force_with_padding(n):
    g = torch.Generator().manual_seed(n)
    s, r = torch.randn(n, n, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)
    want_e, want_r = _brute_force(s, r)
    w = 7  # padded grid: padding units must change nothing and get nothing
    sp = torch.randn(1, w, w, generator=g, dtype=torch.float64)
    rp = torch.randn(1, w, generator=g, dtype=torch.float64)
    sp[0, :n, :n], rp[0, :n] = s, r
    mask = torch.arange(w)[None] < n
    e, root = matrix_tree_marginals(sp, rp, mask)
    torch.testing.assert_close(e[0, :n, :n], want_e, atol=1e-9, rtol=0)
    torch.testing.assert_close(root[0, :n], want_r, atol=1e-9, rtol=0)
    assert e[0, n:].abs().sum() == 0 and e[0, :, n:].abs().sum() == 0 and root[0, n:].abs().sum() == 0
    # every unit has exactly one parent (another unit or the root)
    torch.testing.assert_close(e[0, :n, :n].sum(0) + root[0, :n], torch.ones(n, dtype=torch.float64))


def test_matrix_tree_is_stable_for_large_scores_and_differentiable():
    s = torch.tensor([[[0.0, 80.0, -80.0], [79.0, 0.0, 80.0], [-80.0, 78.0, 0.0]]], dtype=torch.float64)
    e, root = matrix_tree_marginals(s, torch.tensor([[80.0, -80.0, 79.0]], dtype=torch.float64),
                                    torch.ones(1, 3, dtype=torch.bool))
    assert torch.isfinite(e).all() and torch.isfinite(root).all()
    torch.testing.assert_close(e[0].sum(0) + root[0], torch.ones(3, dtype=torch.float64))
    x = torch.randn(1, 4, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(1, 4, dtype=torch.float64, requires_grad=True)
    m = torch.tensor([[True, True, True, False]])
    assert torch.autograd.gradcheck(lambda a, b: matrix_tree_marginals(a, b, m), (x, y))


def _clusters(seed: int, n: int = 3):
    rng = np.random.default_rng(seed)
    unit = lambda: [rng.integers(6, 64, rng.integers(1, 6)) for _ in range(rng.integers(1, 4))]  # noqa: E731
    return [[unit() for _ in range(rng.integers(1, 5))] for _ in range(n)]


def test_pooling_weights_sum_to_one_within_each_unit_and_graph_rows_are_normalised():
    scores = torch.randn(9, 2)
    token_unit = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    w = unit_softmax(scores, token_unit, 3)
    torch.testing.assert_close(torch.zeros(3, 2).index_add(0, token_unit, w), torch.ones(3, 2))
    g = torch.tensor([[[1.0, 0.5, 0.0], [0.5, 1.0, 0.3], [0.0, 0.3, 1.0]]])
    norm = graph_weights(g, torch.tensor([[True, True, False]]))
    torch.testing.assert_close(norm[0], torch.tensor([[2 / 3, 1 / 3, 0.0], [1 / 3, 2 / 3, 0.0], [0.0, 0.0, 0.0]]))


def test_global_layers_cluster_is_independent_of_the_batch_and_ranks_matter():
    torch.manual_seed(0)
    enc = GlobalEncoder(32, 4, 64, 0.0, 2, graph_attention=True, structural_attention=True).eval()
    clusters = _clusters(1)
    graphs = [unit_graph([np.concatenate(u) for u in c], 0.1) for c in clusters]
    packed = pack_clusters(clusters, graphs)
    x = torch.randn(packed.units.num_real_tokens, 32)
    together = enc(x, packed.layout, packed.graph)
    start = 0
    for c, g in zip(clusters, graphs):
        alone = pack_clusters([c], [g])
        n = alone.units.num_real_tokens
        torch.testing.assert_close(enc(x[start:start + n], alone.layout, alone.graph), together[start:start + n],
                                   atol=1e-5, rtol=1e-5)
        start += n
    big = max(range(len(clusters)), key=lambda i: len(clusters[i]))
    p1 = pack_clusters([clusters[big]], [graphs[big]])
    assert len(clusters[big]) > 1
    y = torch.randn(p1.units.num_real_tokens, 32)
    # the same tokens under a permuted rank: the rank embedding moves the output
    layout = p1.layout
    swapped = type(layout)(layout.unit_cluster, layout.unit_slot, layout.unit_mask, layout.unit_rank.flip(0),
                           layout.token_unit)
    assert not torch.allclose(enc(y, layout, p1.graph), enc(y, swapped, p1.graph))


def test_cluster_memory_equals_the_single_document_memory_without_global_layers():
    torch.manual_seed(0)
    dec = DecoderConfig(layers=1, dropout=0.0, max_positions=64)
    mds = HibertMDS(ENC, dec, MDSConfig(global_layers=0)).eval()
    single = HibertAbstractive(ENC, dec).eval()
    single.load_state_dict(mds.state_dict())
    doc = _clusters(2, 1)[0][0]
    ours = source_memory(mds.memory(pack_clusters([[doc]])), add_sentence_vectors=False)
    theirs = source_memory(single.encoder(make_abstractive_batch([doc], [[7]]).docs), add_sentence_vectors=True)
    torch.testing.assert_close(ours.states, theirs.states)
    assert torch.equal(ours.ids, theirs.ids) and torch.equal(ours.key_mask, theirs.key_mask)


@pytest.mark.parametrize("cross", ["flat", "pht", "vht"])
def test_mds_trains_everything_and_decodes_each_cluster_as_alone(cross):
    torch.manual_seed(0)
    clusters = _clusters(3)
    targets = [np.random.default_rng(i).integers(6, 64, 5) for i in range(3)]
    graphs = [unit_graph([np.concatenate(u) for u in c], 0.1) for c in clusters]
    model = HibertMDS(ENC, DecoderConfig(layers=1, cross_attention=cross, copy=True, dropout=0.0, max_positions=64),
                      MDSConfig(global_layers=1, graph_attention=True, structural_attention=True))
    out = model(make_mds_batch(clusters, targets, graphs), return_log_probs=True)
    torch.testing.assert_close(out.log_probs.exp().sum(-1), torch.ones(out.log_probs.shape[0]))  # copy mixture
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    gen = GenerationConfig(beam_size=3, max_length=6, no_repeat_ngram=0)
    with torch.no_grad():
        together = generate(model, pack_clusters(clusters, graphs), gen)
        for c, g, h in zip(clusters, graphs, together):
            alone = generate(model, pack_clusters([c], [g]), gen)[0]
            assert list(alone.tokens) == list(h.tokens) and abs(alone.score - h.score) < 1e-4


def test_ranker_losses_by_hand_and_unit_selection():
    layout = pack_clusters([[[[6]], [[7]]], [[[8]], [[9]], [[10]]]]).layout
    scores = torch.tensor([1.0, 0.0, 0.5, -0.5, 0.0])
    labels = torch.tensor([0.3, 0.1, 0.0, 0.0, 0.0])   # the second cluster has no ranking signal: left out
    loss, n = ranker_loss(scores, labels, layout, "listwise")
    want = -(0.75 * math.log(math.e / (math.e + 1)) + 0.25 * math.log(1 / (math.e + 1)))
    assert n == 1 and loss.item() == pytest.approx(want, rel=1e-6)
    loss, n = ranker_loss(scores, labels, layout, "regression")
    bce = lambda s, y: -(y * math.log(1 / (1 + math.exp(-s))) + (1 - y) * math.log(1 - 1 / (1 + math.exp(-s))))  # noqa
    want = (bce(1.0, 0.3) + bce(0.0, 0.1)) / 2 / 2 + (bce(0.5, 0) + bce(-0.5, 0) + bce(0.0, 0)) / 3 / 2
    assert n == 2 and loss.item() == pytest.approx(want, rel=1e-6)
    assert select_units(np.array([0.1, 0.9, 0.5]), np.array([10, 30, 20]), 50).tolist() == [1, 2]
    assert select_units(np.array([0.1, 0.9, 0.5]), np.array([10, 30, 20]), 5).tolist() == [1]


def test_ranker_loads_registered_encoders_strictly_and_scores_clusters_independently():
    from modeling.extractive import HibertExtractive
    from pretrain.export import load_encoder

    torch.manual_seed(0)
    ranker = HibertRanker(ENC).eval()
    load_encoder(ranker.encoder, HibertExtractive(ENC).encoder.state_dict())
    clusters = _clusters(4)
    together = ranker(pack_clusters(clusters).units)
    alone = torch.cat([ranker(pack_clusters([c]).units) for c in clusters])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
