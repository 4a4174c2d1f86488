"""Multi-document modeling on hand-checked cases: cluster packing and the unit graph, matrix-tree marginals
against brute-force enumeration of spanning trees, the global layers (pooling, graph head, padding, batch
independence), the cluster memory against the single-document model, training, incremental decoding against
teacher forcing, and batched decoding of clusters. The ranker: tests/test_modeling_ranker.py."""
import itertools
import math
import sys

import numpy as np
import pytest
import torch

from conftest import REPO
from hibert.config.abstractive import DecoderConfig, GenerationConfig
from hibert.config.mds import MDSConfig
from hibert.config.model import ModelConfig
from hibert.finetune.abstractive.data import make_abstractive_batch, make_mds_batch
from hibert.tokens import BOS_ID, EOS_ID, PAD_ID
from hibert.modeling.abstractive import HibertAbstractive
from hibert.tfidf import unit_graph
from hibert.modeling.clusters import pack_clusters
from hibert.modeling.generate import generate
from hibert.modeling.hierarchical import GlobalEncoder, graph_weights, unit_softmax
from hibert.modeling.mds import HibertMDS, MDSBatch
from hibert.modeling.packing import pack_documents
from hibert.modeling.source_memory import source_memory
from hibert.modeling.structural import matrix_tree_marginals

sys.path.insert(0, str(REPO / "benchmarks"))  # the no-cache reference decoder is the benchmark's
from recompute_decode import decode_prefix  # noqa: E402

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
    # huge scores where nothing is read (the diagonal, padding) must not poison the backward with 0 * inf
    s = torch.zeros(1, 3, 3, dtype=torch.float64)
    s[0, 1, 1], s[0, 2, 0], s[0, 0, 2] = 800.0, 900.0, -900.0
    s.requires_grad_(True)
    rho = torch.tensor([[0.0, 0.0, 850.0]], dtype=torch.float64, requires_grad=True)
    e, root = matrix_tree_marginals(s, rho, torch.tensor([[True, True, False]]))
    (e.sum() + root.sum()).backward()
    assert torch.isfinite(s.grad).all() and torch.isfinite(rho.grad).all()


def _clusters(seed: int, n: int = 3):
    rng = np.random.default_rng(seed)
    unit = lambda: [rng.integers(6, 64, rng.integers(1, 6)) for _ in range(rng.integers(1, 4))]  # noqa: E731
    return [[unit() for _ in range(rng.integers(1, 5))] for _ in range(n)]


def _graphs(clusters) -> list[np.ndarray]:
    return [unit_graph([np.concatenate(u) for u in c], 0.1, "sublinear") for c in clusters]


# ---------------------------------------------------------------------------------------------- packing
def test_pack_clusters_layout_on_a_hand_made_batch():
    a, b, c = [[6, 7], [8]], [[9]], [[10, 11, 12]]   # units: a, b in cluster 0, c in cluster 1
    g0 = np.array([[1.0, 0.5], [0.5, 1.0]], dtype=np.float32)
    packed = pack_clusters([[a, b], [c]], [g0, np.ones((1, 1), np.float32)])
    assert packed.num_docs == 2 and packed.tokens is packed.units.tokens
    # the local encoder sees every unit as a document, cluster-major
    u = packed.units
    assert u.num_docs == 3 and u.doc_lens.tolist() == [2, 1, 1] and u.sent_lens.tolist() == [3, 2, 2, 4]
    lay = packed.layout
    assert (lay.num_clusters, lay.max_units, lay.num_units) == (2, 2, 3)
    assert lay.unit_cluster.tolist() == [0, 0, 1] and lay.unit_slot.tolist() == [0, 1, 2]
    assert lay.unit_rank.tolist() == [0, 1, 0] and lay.unit_mask.tolist() == [[True, True], [True, False]]
    assert lay.token_unit.tolist() == [0] * 5 + [1] * 2 + [2] * 4
    # the decoder memory: one document per cluster, one "sentence" per unit (its sentences with their EOS)
    m = packed.memory_docs
    assert m.doc_lens.tolist() == [2, 1] and m.sent_lens.tolist() == [5, 2, 4]
    assert m.tokens[0, :6].tolist() == [6, 7, EOS_ID, 8, EOS_ID, PAD_ID]
    assert m.tokens[1, :2].tolist() == [9, EOS_ID] and m.tokens[2, :4].tolist() == [10, 11, 12, EOS_ID]
    flat = lambda p: p.tokens.reshape(-1)[p.token_index]  # noqa: E731
    assert torch.equal(flat(m), flat(u)) and m.num_real_tokens == u.num_real_tokens == 11  # same stream
    assert packed.graph.tolist() == [[[1.0, 0.5], [0.5, 1.0]], [[1.0, 0.0], [0.0, 0.0]]]
    assert pack_clusters([[a, b], [c]]).graph is None
    moved = packed.to("cpu")
    assert moved.num_docs == 2 and moved.layout.token_unit.tolist() == lay.token_unit.tolist()
    with pytest.raises(ValueError, match="no units"):
        pack_clusters([[a], []])
    with pytest.raises(ValueError, match="graphs for"):
        pack_clusters([[a, b], [c]], [g0])
    with pytest.raises(ValueError, match="for 2 units"):
        pack_clusters([[a, b], [c]], [np.ones((1, 1)), np.ones((1, 1))])


def test_unit_graph_by_hand():
    # "sublinear" (exports made before eq. 25): units {6, 6, 7}, {7, 8}, {9}, {} over U = 4:
    # idf = log(5 / (1 + df)) + 1, tf weight 1 + log(count)
    g = unit_graph([[6, 6, 7], [7, 8], [9], []], threshold=0.1, weighting="sublinear")
    idf1, idf2 = math.log(5 / 2) + 1, math.log(5 / 3) + 1
    u0 = np.array([(1 + math.log(2)) * idf1, idf2, 0.0])   # over words 6, 7, 8
    u1 = np.array([0.0, idf2, idf1])
    cos = float(u0 @ u1 / np.linalg.norm(u0) / np.linalg.norm(u1))
    want = np.eye(4, dtype=np.float32)
    want[0, 1] = want[1, 0] = cos
    assert g.dtype == np.float32 and 0.1 < cos < 0.5
    np.testing.assert_allclose(g, want, rtol=1e-6)
    # the edge goes below a higher threshold; self loops stay (the empty unit too); rows not normalised
    np.testing.assert_array_equal(unit_graph([[6, 6, 7], [7, 8], [9], []], threshold=0.5, weighting="sublinear"),
                                  np.eye(4))
    # texts: lower-cased whitespace words, the same bags
    np.testing.assert_allclose(unit_graph(["x x Y", "y z", "w", ""], 0.1, "sublinear"), want, rtol=1e-6)
    assert unit_graph([], 0.1).shape == (0, 0)


def test_unit_graph_eq25_by_hand():
    """Liu & Lapata eq. 25: v = N_w log(N_d / N_dw). Units "x x y", "y z", "w", "" (N_d = 4): over x, y, z
    u0 = (2 log 4, log 2, 0) = log 2 (4, 1, 0), u1 = (0, log 2, log 4) = log 2 (0, 1, 2): cos = 1 / sqrt(85)."""
    g = unit_graph(["x x Y", "y z", "w", ""], threshold=0.1)           # eq25 is the default
    want = np.eye(4, dtype=np.float32)
    want[0, 1] = want[1, 0] = 1 / math.sqrt(85)
    np.testing.assert_allclose(g, want, rtol=1e-6)
    assert (unit_graph(["x x Y", "y z", "w", ""], threshold=0.11) == np.eye(4)).all()   # 0.108 < 0.11
    # a word in every unit weighs log(1) = 0: units sharing only it have no edge (sublinear would link them)
    np.testing.assert_array_equal(unit_graph(["a b", "a c"], 0.0), np.eye(2))
    assert unit_graph(["a b", "a c"], 0.0, "sublinear")[0, 1] > 0.2
    with pytest.raises(ValueError, match="weighting"):
        unit_graph(["a"], 0.1, "bm25")


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
    graphs = [unit_graph([np.concatenate(u) for u in c], 0.1, "sublinear") for c in clusters]
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


def _literal_global_layer(layer, x: torch.Tensor, token_unit: torch.Tensor, unit_cluster: torch.Tensor,
                          head0: torch.Tensor | None = None):
    """Liu & Lapata eq. 13-20 written out unit by unit and head by head (plus the residual and FFN). `head0`
    [U, U]: head 0's attention of unit u over unit o instead of eq. 20's softmax (eq. 24's graph head)."""
    h, d = layer.heads, x.shape[1] // layer.heads
    xn, pool = layer.norm(x), layer.pool
    n_units = len(unit_cluster)
    head = torch.zeros(n_units, h, d)
    for u in range(n_units):
        tok = xn[token_unit == u]
        for z in range(h):
            a = tok @ pool.score.weight[z] + pool.score.bias[z]                                    # (13)
            b = tok @ pool.value.weight[z * d:(z + 1) * d].T + pool.value.bias[z * d:(z + 1) * d]  # (14)
            a_hat = a.exp() / a.exp().sum()                                                        # (15)
            c = (a_hat[:, None] * b).sum(0) @ pool.mix.weight[z] + pool.mix.bias[z]
            head[u, z] = torch.nn.functional.layer_norm(c, (d,), pool.norm.weight, pool.norm.bias)  # (16)
    w, bias = layer.qkv.weight, layer.qkv.bias
    proj = lambda u, z, i: head[u, z] @ w[z][:, i * d:(i + 1) * d] + bias[z][i * d:(i + 1) * d]  # noqa: E731 (17-19)
    context = torch.zeros(n_units, h * d)
    for u in range(n_units):
        others = [o for o in range(n_units) if unit_cluster[o] == unit_cluster[u]]
        for z in range(h):
            scores = torch.stack([proj(u, z, 0) @ proj(o, z, 1) for o in others]) / math.sqrt(d)
            p = scores.exp() / scores.exp().sum()
            if z == 0 and head0 is not None:
                p = head0[u, others]
            context[u, z * d:(z + 1) * d] = sum(p_o * proj(o, z, 2) for p_o, o in zip(p, others))  # (20)
    y = x + layer.out(context)[token_unit]
    return y + layer.ffn_out(torch.relu(layer.ffn_in(layer.ffn_norm(y))))


def test_global_layer_is_liu_lapata_eq_13_to_20_per_head():
    """Per-head W_c + LayerNorm on the pooled heads and per-head q/k/v, against the equations written out;
    padding of the unit grid (clusters of 1-4 units) changes nothing."""
    torch.manual_seed(3)
    enc = GlobalEncoder(16, 4, 32, 0.0, 1, rank_embedding=False).eval()
    layer = enc.layers[0]
    with torch.no_grad():                      # non-trivial LayerNorm affine and biases
        for prm in layer.parameters():
            prm.add_(0.1 * torch.randn_like(prm))
    packed = pack_clusters(_clusters(4, 4))
    x = torch.randn(packed.units.num_real_tokens, 16)
    with torch.no_grad():
        got = layer(x, packed.layout)
        want = _literal_global_layer(layer, x, packed.layout.token_unit, packed.layout.unit_cluster)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the heads have their own projections (hiersumm shares them; the paper does not)
    assert not torch.allclose(layer.qkv.weight[0], layer.qkv.weight[1])
    assert not torch.allclose(layer.pool.mix.weight[0], layer.pool.mix.weight[1])


# ---------------------------------------------------------------------------------------------- graph / structure
def _graph_case():
    """Two clusters (3 units, 2 units + a padding slot), their hand-made unit graphs (self loops 1, not
    row-normalised, as unit_graph gives them) and the graph head's weights by hand: each row over the
    cluster's real units divided by its sum, padding rows and columns 0."""
    clusters = [[[[6, 7], [8]], [[9, 10]], [[11]]], [[[12, 13, 14]], [[15], [16, 17]]]]
    graphs = [np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.3], [0.0, 0.3, 1.0]], np.float32),
              np.array([[1.0, 0.25], [0.25, 1.0]], np.float32)]
    want = torch.tensor([[[2 / 3, 1 / 3, 0.0], [5 / 18, 10 / 18, 3 / 18], [0.0, 3 / 13, 10 / 13]],
                         [[0.8, 0.2, 0.0], [0.2, 0.8, 0.0], [0.0, 0.0, 0.0]]])
    return clusters, graphs, want


def _perturbed(enc: GlobalEncoder, seed: int) -> GlobalEncoder:
    """Non-trivial LayerNorm affines and biases (init_weights zeroes biases)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for prm in enc.parameters():
            prm.add_(0.1 * torch.randn(prm.shape, generator=g))
    return enc


def test_graph_head_attends_with_the_row_normalised_unit_graph():
    """Eq. 24: head 0's weights over the units are the given graph, row-normalised over the real units of
    the cluster; the other heads keep eq. 20's softmax; the layer's output is eq. 13-20 written out with
    head 0's weights replaced by that graph."""
    clusters, graphs, want = _graph_case()
    torch.manual_seed(5)
    layer = _perturbed(GlobalEncoder(16, 4, 32, 0.0, 1, graph_attention=True, rank_embedding=False), 5).eval().layers[0]
    packed = pack_clusters(clusters, graphs)
    lay = packed.layout
    x = torch.randn(packed.units.num_real_tokens, 16)
    with torch.no_grad():
        pooled, _ = layer.pool(layer.norm(x), lay)
        on, _ = layer.unit_weights(pooled, lay, packed.graph)
        torch.testing.assert_close(on[:, 0], want, atol=1e-6, rtol=0)
        # whatever the graph holds on padding is not read
        noisy = packed.graph.clone()
        noisy[1, 2, :] = noisy[1, :, 2] = 9.0
        torch.testing.assert_close(layer.unit_weights(pooled, lay, noisy)[0], on)
        layer.graph_attention = False
        off, _ = layer.unit_weights(pooled, lay, packed.graph)
        layer.graph_attention = True
        torch.testing.assert_close(off[:, 1:], on[:, 1:])          # only head 0 is replaced
        assert not torch.allclose(off[:, 0], want, atol=1e-3)      # softmax puts weight where the graph has none
        head0 = torch.zeros(5, 5)
        head0[:3, :3], head0[3:, 3:] = want[0], want[1, :2, :2]
        got = layer(x, lay, packed.graph)
        ref = _literal_global_layer(layer, x, lay.token_unit, lay.unit_cluster, head0)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_graph_attention_on_and_off_share_weights_and_differ_only_through_head_0():
    clusters, graphs, _ = _graph_case()
    torch.manual_seed(6)
    on = _perturbed(GlobalEncoder(16, 4, 32, 0.0, 1, graph_attention=True), 6).eval()
    off = GlobalEncoder(16, 4, 32, 0.0, 1, graph_attention=False).eval()
    off.load_state_dict(on.state_dict(), strict=True)               # the graph head adds no parameter
    packed = pack_clusters(clusters, graphs)
    lay, graph = packed.layout, packed.graph
    x = torch.randn(packed.units.num_real_tokens, 16)
    with torch.no_grad():
        y_on, y_off = on(x, lay, graph), off(x, lay, graph)
        assert (y_on - y_off).abs().max() > 1e-3
        torch.testing.assert_close(off(x, lay, None), y_off)        # off: the graph is not read
        eye = torch.eye(3).expand(2, 3, 3)
        assert (on(x, lay, eye) - y_on).abs().max() > 1e-3          # on: another graph, another output
        with pytest.raises(ValueError, match="unit graph"):
            on(x, lay, None)
        for enc in (on, off):                                       # drop head 0's context from the output
            enc.layers[0].out.weight[:, :4] = 0.0
        torch.testing.assert_close(on(x, lay, graph), off(x, lay, graph))


def test_graph_and_structural_attention_toggle_independently():
    """The four settings of (graph head, structural attention) on the same weights: each switch changes the
    output on its own; structural attention only adds its term (zeroed, the output is the one without it,
    graph head on or off) and the graph head acts only through head 0 (with head 0's context dropped, the
    output is the one without it, structural attention on or off)."""
    clusters, graphs, _ = _graph_case()
    torch.manual_seed(7)
    full = _perturbed(GlobalEncoder(16, 4, 32, 0.0, 1, graph_attention=True, structural_attention=True), 7)
    packed = pack_clusters(clusters, graphs)
    lay = packed.layout
    x = torch.randn(packed.units.num_real_tokens, 16)
    settings = [(g, s) for g in (False, True) for s in (False, True)]
    encs = {}
    for g, s in settings:
        enc = GlobalEncoder(16, 4, 32, 0.0, 1, graph_attention=g, structural_attention=s).eval()
        res = enc.load_state_dict(full.state_dict(), strict=False)
        assert res.missing_keys == []
        assert all(".structure." in k for k in res.unexpected_keys) and bool(res.unexpected_keys) == (not s)
        assert enc.layers[0].graph_attention == g and (enc.layers[0].structure is not None) == s
        encs[g, s] = enc
    # structural attention alone needs no graph
    run = lambda: {(g, s): encs[g, s](x, lay, packed.graph if g else None) for g, s in settings}  # noqa: E731
    with torch.no_grad():
        y = run()
        for a, b in itertools.combinations(settings, 2):
            assert (y[a] - y[b]).abs().max() > 1e-3, (a, b)
        for g in (False, True):
            encs[g, True].layers[0].structure.out.weight.zero_()
            encs[g, True].layers[0].structure.out.bias.zero_()
        y = run()
        for g in (False, True):
            torch.testing.assert_close(y[g, True], y[g, False])
        for s in (False, True):
            assert (y[True, s] - y[False, s]).abs().max() > 1e-3
            for g in (False, True):
                encs[g, s].layers[0].out.weight[:, :4] = 0.0
        y = run()
        for s in (False, True):
            torch.testing.assert_close(y[True, s], y[False, s])


@pytest.mark.parametrize("graph,structure", [(False, False), (True, False), (False, True), (True, True)])
def test_mds_config_switches_the_graph_head_and_structural_attention_separately(graph, structure):
    model = HibertMDS(ENC, DecoderConfig(layers=1, dropout=0.0, max_positions=64),
                      MDSConfig(global_layers=2, graph_attention=graph, structural_attention=structure))
    for layer in model.global_encoder.layers:
        assert layer.graph_attention == graph and (layer.structure is not None) == structure
    assert any(".structure." in k for k in model.state_dict()) == structure
    clusters = _clusters(8)
    targets = _targets(9, len(clusters))
    if graph:
        with pytest.raises(ValueError, match="unit graph"):
            model(make_mds_batch(clusters, targets))
    out = model(make_mds_batch(clusters, targets, _graphs(clusters) if graph else None))
    assert torch.isfinite(out.loss)
    out.loss.backward()
    if structure:
        grads = [p.grad for layer in model.global_encoder.layers for p in layer.structure.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert sum(float(g.abs().sum()) for g in grads) > 0


def test_exports_without_global_layer_form_load_as_v0():
    from hibert.finetune.mds.export import stored_mds_config

    assert stored_mds_config({"global_layers": 1}).global_layer == "v0"
    assert stored_mds_config({"global_layers": 1}).graph_weighting == "sublinear"  # made before eq. 25
    assert stored_mds_config(MDSConfig().model_dump(mode="json")).graph_weighting == "eq25"
    assert stored_mds_config(MDSConfig().model_dump(mode="json")).global_layer == "liu_lapata"
    old = HibertMDS(ENC, DecoderConfig(layers=1), MDSConfig(global_layers=1, global_layer="v0"))
    keys = {k for k in old.state_dict() if k.startswith("global_encoder.layers.0.")}
    assert {"global_encoder.layers.0.query.weight", "global_encoder.layers.0.key.weight"} <= keys
    assert not any(".qkv." in k or ".pool.mix." in k for k in keys)


def _model(cross: str = "flat", copy: bool = False, structure: bool = False, layers: int = 1, seed: int = 0,
           **mds) -> HibertMDS:
    """Tiny summarizer; `structure` switches on both the graph head and structural attention (each on its
    own: test_graph_and_structural_attention_toggle_independently and the MDS config test below it)."""
    torch.manual_seed(seed)
    dec = DecoderConfig(layers=1, cross_attention=cross, copy=copy, dropout=0.0, max_positions=64)
    return HibertMDS(ENC, dec, MDSConfig(global_layers=layers, graph_attention=structure,
                                         structural_attention=structure, **mds))


def _targets(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(6, 64, rng.integers(0, 7)) for _ in range(n)]


# ---------------------------------------------------------------------------------------------- memory
def test_without_global_layers_one_unit_clusters_are_the_single_document_model():
    """global_layers=0 and one unit per cluster: the memory (and so a flat copy decoder's every log-prob) is
    HibertAbstractive's on the same documents with the same weights."""
    mds = _model("flat", copy=True, layers=0).eval()
    single = HibertAbstractive(ENC, mds.dec_cfg).eval()
    single.load_state_dict(mds.state_dict(), strict=True)
    docs = [u for c in _clusters(2, 2) for u in c[:1]]
    targets = _targets(3, len(docs))
    with torch.no_grad():
        ours = mds.cluster_memory(pack_clusters([[d] for d in docs]))
        theirs = source_memory(single.encoder(pack_documents(docs)), add_sentence_vectors=True)
        torch.testing.assert_close(ours.states, theirs.states)
        for field in ("slot", "key_mask", "ids"):
            assert torch.equal(getattr(ours, field), getattr(theirs, field)), field
        got = mds(make_mds_batch([[d] for d in docs], targets), return_log_probs=True)
        want = single(make_abstractive_batch(docs, targets), return_log_probs=True)
    torch.testing.assert_close(got.log_probs, want.log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.loss, want.loss)


# ---------------------------------------------------------------------------------------------- training / decoding
VARIANTS = [(cross, copy) for cross in ("flat", "pht", "vht") for copy in (False, True)]


@pytest.mark.parametrize("cross,copy", VARIANTS)
def test_mds_trains_every_part_and_cached_decoding_equals_teacher_forcing(cross, copy):
    """Copy variants also run the graph head and structural attention. Training: finite loss, the copy
    mixture sums to 1, gradients reach the local encoder, the global layers and the decoder. Decoding (eval,
    fp32): K=2 hypotheses per cluster through the KV cache, and the no-cache prefix recomputation, give the
    teacher-forced log-probs of the same prefixes within 1e-5."""
    clusters = _clusters(3)
    graphs = _graphs(clusters) if copy else None
    model = _model(cross, copy, structure=copy)
    targets = _targets(4, 6)                         # two per cluster: row b * 2 + j
    batch = make_mds_batch(clusters, targets[::2], graphs)
    assert isinstance(batch, MDSBatch) and batch.num_docs == 3
    out = model(batch, return_log_probs=True)
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.log_probs.exp().sum(-1), torch.ones(out.log_probs.shape[0]))
    out.loss.backward()
    for part in (model.encoder, model.global_encoder, model.decoder):
        grads = [p.grad for p in part.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert sum(float(g.abs().sum()) for g in grads) > 0

    model.eval()
    twice = [c for c in clusters for _ in range(2)]
    tf_batch = make_mds_batch(twice, targets, None if graphs is None else [g for g in graphs for _ in range(2)])
    with torch.no_grad():
        ref = model(tf_batch, return_log_probs=True).log_probs
    steps = int(tf_batch.target_lens.max())
    inputs = torch.full((6, steps), BOS_ID)
    for r, t in enumerate(targets):
        inputs[r, 1:len(t) + 1] = torch.as_tensor(t)
    start = tf_batch.dec_cu.long()
    worst = worst_prefix = 0.0
    with torch.no_grad():
        state = model.start_decoding(pack_clusters(clusters, graphs), beams=2, max_len=steps)
        assert state.num_docs == 3 and state.cache.rows == 6  # memory per cluster, never tiled over beams
        for t in range(steps):
            step = model.decode_step(inputs[:, t], state)
            prefix = decode_prefix(model, inputs[:, : t + 1], state.memory)
            for r in range(6):
                if t < tf_batch.target_lens[r]:
                    worst = max(worst, (step[r] - ref[start[r] + t]).abs().max().item())
                    worst_prefix = max(worst_prefix, (prefix[r] - ref[start[r] + t]).abs().max().item())
    assert worst < 1e-5 and worst_prefix < 1e-5


def _eos_leaning(cross: str, copy: bool, strength: float) -> HibertMDS:
    """A tiny summarizer whose random weights lean towards EOS by `strength` (random weights almost never end):
    the decoder's last LayerNorm (and the structural context, which joins the state the vocabulary reads) get
    a bias along the EOS embedding; copying (which never votes for EOS) is made unlikely."""
    model = _model(cross, copy, structure=True, seed=2).eval()
    with torch.no_grad():
        eos = model.output_weight()[EOS_ID]
        model.decoder.layers[-1].ffn_norm.bias += strength * eos / eos.norm()
        model.decoder.structure.out.bias += strength * eos / eos.norm()
        if copy:
            model.decoder.copy_gate.bias += 6.0
    return model


@pytest.mark.parametrize("cross,copy", [("flat", False), ("flat", True), ("pht", True), ("vht", True)])
def test_each_cluster_of_a_batch_decodes_as_alone(cross, copy):
    clusters = _clusters(5)
    graphs = _graphs(clusters)
    gen = GenerationConfig(beam_size=3, min_length=1, max_length=8, no_repeat_ngram=0)
    for strength in np.linspace(0.5, 4.0, 15):  # the first lean at which clusters finish at different steps
        model = _eos_leaning(cross, copy, float(strength))
        together = generate(model, pack_clusters(clusters, graphs), gen)
        if len({len(h.tokens) for h in together}) > 1:
            break
    assert len({len(h.tokens) for h in together}) > 1  # clusters finish at different steps and leave the batch
    for c, g, h in zip(clusters, graphs, together):
        alone = generate(model, pack_clusters([c], [g]), gen)[0]
        assert list(alone.tokens) == list(h.tokens) and abs(alone.score - h.score) < 1e-4


def test_more_units_than_rank_positions_is_an_error():
    model = _model(layers=1, max_units=2).eval()
    with pytest.raises(ValueError, match="max_units"):
        model.encode(pack_clusters([[[[6]], [[7]], [[8]]]]))



# ---------------------------------------------------------------------------------------------- structural parts
def _literal_structure(sa, units: torch.Tensor, n: int) -> torch.Tensor:
    """Chowdhury et al. §2.2 for one cluster of n real units, with brute-force tree marginals:
    [e, d] = h (eq. 1), f_jk = tanh(W_c d_k)^T W_a tanh(W_p d_j), f^r_j = W_r d_j,
    s_i = a^r_i e_root + sum_k a_ki e_k, c_i = sum_k a_ik e_k, r_i = tanh(W [e_i; s_i; c_i])."""
    h = units[:n].double()
    e, d = (h[:, : sa.e_dim], h[:, sa.e_dim:]) if sa.split else (h, h)
    lin = lambda layer, x: x @ layer.weight.double().T + layer.bias.double()  # noqa: E731
    u_p, u_c = torch.tanh(lin(sa.parent, d)), torch.tanh(lin(sa.child, d))
    f = u_p @ sa.bilinear.double() @ u_c.T                       # f[j, k]: j parent of k
    edge, root = _brute_force(f, lin(sa.root, d).squeeze(-1))
    s = edge.T @ e
    if sa.root_vector is not None:
        s = s + root[:, None] * sa.root_vector.double()
    c = edge @ e
    return torch.tanh(lin(sa.out, torch.cat([e, s, c], -1)))


@pytest.mark.parametrize("split,root", [(True, True), (False, False), (True, False), (False, True)])
def test_structural_attention_is_chowdhury_eq_1_2_by_hand(split, root):
    from hibert.modeling.structural import StructuralAttention

    torch.manual_seed(3)
    sa = StructuralAttention(8, split=split, root=root)
    units = torch.randn(2, 4, 8)
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    with torch.no_grad():
        got = sa(units, mask)
        for b, n in enumerate((3, 4)):
            torch.testing.assert_close(got[b, :n].double(), _literal_structure(sa, units[b], n), atol=1e-5, rtol=0)
    assert got[0, 3].abs().sum() == 0
    # split: the tree is scored from the structural half only, the semantic half is what is aggregated
    assert sa.parent.in_features == (4 if split else 8) and sa.out.in_features == (12 if split else 24)
    if root:  # a single unit is the root with probability 1: its parent context is e_root itself
        one = torch.randn(1, 1, 8)
        with torch.no_grad():
            e = one[0, :, : sa.e_dim]
            want = torch.tanh(sa.out(torch.cat([e, sa.root_vector[None], torch.zeros_like(e)], -1)))
            torch.testing.assert_close(sa(one, torch.ones(1, 1, dtype=torch.bool))[0], want)
    else:     # both off: the earlier form, the keys older exports hold
        assert sa.root_vector is None


def test_decoder_structural_context_feeds_vocab_and_gate_not_copy():
    """The dot form: c_struct = out(sum_u softmax_u(q(s) . k(g_u) / sqrt(d)) v(h_u)) per head (the additive form
    by hand: tests/test_paper_options.py); c_struct changes p_vocab and p_gen, while the copy distribution keeps
    the plain token attention."""
    from hibert.modeling.structural import StructuralContext

    torch.manual_seed(4)
    ctx = StructuralContext(8, heads=2, form="dot")
    g, h = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    mask = torch.tensor([[True, True, False]])
    x = torch.randn(1, 2, 8)
    with torch.no_grad():
        got = ctx(x, *ctx.prepare(g, h, mask))
        q, k, v = ctx.q(x)[0], ctx.k(g)[0], ctx.v(h)[0]
        heads = []
        for z in range(2):
            sl = slice(4 * z, 4 * z + 4)
            a = torch.softmax((q[:, sl] @ k[:2, sl].T) / 2.0, -1)     # padding unit 2 left out
            heads.append(a @ v[:2, sl])
        torch.testing.assert_close(got[0], ctx.out(torch.cat(heads, -1)), atol=1e-6, rtol=1e-5)

    clusters = _clusters(3)
    model = _model("flat", copy=True, structure=True).eval()
    assert model.decoder.structure is not None
    batch = make_mds_batch(clusters, _targets(4, 3), _graphs(clusters))
    with torch.no_grad():
        base = model(batch, return_log_probs=True).log_probs
        model.decoder.copy_gate.bias.fill_(-40.0)                # all copy: the plain token attention
        copy_only = model(batch, return_log_probs=True).log_probs
        model.decoder.structure.out.weight.mul_(3.0)             # c_struct changes, p_gen ~ 0 ...
        moved = model(batch, return_log_probs=True).log_probs
    torch.testing.assert_close(moved.exp(), copy_only.exp(), atol=1e-6, rtol=0)  # ... the copy part does not
    assert not torch.allclose(base, copy_only)
    with torch.no_grad():
        model.decoder.copy_gate.bias.fill_(0.0)
        before = model(batch, return_log_probs=True).log_probs
        model.decoder.structure.out.weight.mul_(3.0)
        after = model(batch, return_log_probs=True).log_probs
    assert (after - before).abs().max() > 1e-3                   # ... p_vocab and p_gen read it


def test_structural_switches_and_older_exports():
    from hibert.finetune.mds.export import stored_mds_config

    old = stored_mds_config({"global_layers": 1, "structural_attention": True})
    assert not (old.structural_split or old.structural_root or old.structural_decoder)
    model = HibertMDS(ENC, DecoderConfig(layers=1), old)
    keys = set(model.state_dict())
    assert not any("root_vector" in k or k.startswith("decoder.structure.") for k in keys)
    assert model.state_dict()["global_encoder.layers.0.structure.out.weight"].shape == (32, 96)
    new = HibertMDS(ENC, DecoderConfig(layers=1), MDSConfig(global_layers=1, structural_attention=True))
    keys = set(new.state_dict())
    assert "global_encoder.layers.0.structure.root_vector" in keys and "decoder.structure.w_g.weight" in keys
    old_ctx = HibertMDS(ENC, DecoderConfig(layers=1), stored_mds_config(
        {"global_layers": 1, "structural_attention": True, "structural_decoder": True}))
    assert old_ctx.decoder.structure.form == "dot" and "decoder.structure.q.weight" in old_ctx.state_dict()
    off = HibertMDS(ENC, DecoderConfig(layers=1), MDSConfig(global_layers=1, structural_attention=True,
                                                            structural_decoder=False))
    assert off.decoder.structure is None
