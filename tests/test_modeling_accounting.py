"""Parameter counts and the FLOP formula used for MFU."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from hibert.config import load_config
from hibert.config.model import ModelConfig
from hibert.modeling import (HibertEncoder, HibertExtractive, HibertForPretraining, count_parameters, flops_per_batch,
                      pack_documents)


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("size", ["hibert_s", "hibert_m", "hibert_tiny"])
def test_parameter_counts_are_exact(size):
    cfg = load_config(None, [f"model={size}"]).model
    with torch.device("meta"):  # no memory, no init cost
        pre, ext = HibertForPretraining(cfg), HibertExtractive(cfg)
    counts = count_parameters(cfg)
    assert counts["pretraining"] == numel(pre)
    assert counts["encoder"] == numel(pre.encoder) and counts["decoder"] == numel(pre.decoder)
    assert counts["extractive"] == numel(ext) and counts["head"] == numel(ext.head)
    assert counts["total"] == counts["encoder"] + counts["decoder"] + counts["head"]


def test_parameter_counts_of_variants():
    cfg = ModelConfig(vocab_size=50, hidden=16, layers=2, heads=2, ffn=24, decoder_layers=1, norm_first=True,
                      tie_output_embeddings=False)
    counts = count_parameters(cfg, num_labels="sigmoid")
    assert counts["pretraining"] == numel(HibertForPretraining(cfg))
    assert counts["extractive"] == numel(HibertExtractive(cfg, "sigmoid"))


def test_paper_sizes():
    """HIBERT §4.3 compares BERT-base (110M) with 'half the parameters, 54.6M': that is HIBERT_S. With a
    32000-piece vocabulary its extractive model has 54.2M (the paper's BPE vocabulary was a little larger);
    HIBERT_M's has 109.6M."""
    s = count_parameters(load_config(None, ["model=hibert_s"]).model)
    m = count_parameters(load_config(None, ["model=hibert_m"]).model)
    assert s["extractive"] == 54_213_634 and abs(s["extractive"] - 54.6e6) < 0.01 * 54.6e6
    assert m["extractive"] == 109_632_002
    # paper §3.2: the decoder has the encoder's size; tied output projection adds nothing
    assert s["decoder"] == (s["encoder"] - s["embedding"]) // 2


def test_flops_against_a_hand_count():
    """Every matmul of a tiny batch written out: 2 sentences of 2 and 3 tokens in one document, one
    masked sentence decoded over 2 steps."""
    cfg = ModelConfig(vocab_size=10, hidden=8, ffn=16, layers=1, heads=2, decoder_layers=1)
    h, f, v, heads = 8, 16, 10, 2
    d = h // heads

    def mm(m: int, k: int, n: int) -> int:
        return 2 * m * k * n

    def layer(length: int, causal: bool = False) -> int:
        total = 3 * mm(length, h, h) + mm(length, h, h) + mm(length, h, f) + mm(length, f, h)
        for _ in range(heads):
            for row in range(length):
                keys = row + 1 if causal else length
                total += mm(1, d, keys) + mm(1, keys, d)  # q·Kᵀ for this row, then its weights·V
        return total

    sentence_level = layer(2) + layer(3)
    document_level = layer(2)
    decoder = layer(2, causal=True) + mm(2, h, v)
    assert sentence_level == 2 * (8 * 64 + 4 * 128) + 3 * (8 * 64 + 4 * 128) + 4 * 8 * (4 + 9)
    forward = sentence_level + document_level + decoder
    assert flops_per_batch(cfg, [2, 3], [2], [2], backward=False) == forward
    assert flops_per_batch(cfg, [2, 3], [2], [2]) == 3 * forward
    assert flops_per_batch(cfg, [2, 3, 0, 0], [2], backward=False) == sentence_level + document_level


def test_flops_match_torch_flop_counter_without_padding():
    """On a batch with no padding, torch's FLOP counter over the real encoder agrees with the formula."""
    cfg = ModelConfig(vocab_size=50, hidden=32, layers=2, heads=4, dropout=0.0, max_positions=64)
    docs = [[[7, 8, 9]] * 3, [[10, 11, 12]] * 3]
    packed = pack_documents(docs, pad_to_multiple=1)
    with FlopCounterMode(display=False) as counter, sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
        HibertEncoder(cfg).eval()(packed)
    assert counter.get_total_flops() == flops_per_batch(cfg, packed.sent_lens, packed.doc_lens, backward=False)
