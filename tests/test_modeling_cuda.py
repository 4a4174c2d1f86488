"""The CUDA path of modeling/: variable-length attention kernels on the packed stream must compute what the
padded layout computes, in fp32 and under bf16 autocast, and compile. Skipped where there is no GPU."""
import numpy as np
import pytest
import torch

from hibert.config.model import ModelConfig
from hibert.tokens import MASK_ID
from hibert.modeling import HibertForPretraining, make_padded_pretrain_batch, make_pretrain_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CFG = ModelConfig(name="test", vocab_size=300, hidden=128, layers=2, heads=2, dropout=0.0, max_positions=64)


def batch_inputs(seed: int, n_docs: int = 6):
    rng = np.random.default_rng(seed)
    docs = [[rng.integers(6, CFG.vocab_size, rng.integers(0, 40)) for _ in range(rng.integers(1, 25))]
            for _ in range(n_docs)]
    positions = [sorted(rng.choice(len(d), max(1, len(d) // 7), replace=False).tolist()) for d in docs]
    masked = [[np.full(len(s), MASK_ID) if i in p else s for i, s in enumerate(d)] for d, p in zip(docs, positions)]
    return masked, positions, [[d[i] for i in p] for d, p in zip(docs, positions)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_kernels_match_the_padded_layout(dtype):
    torch.manual_seed(0)
    model = HibertForPretraining(CFG).cuda().eval()
    inputs = batch_inputs(0)
    packed, padded = make_pretrain_batch(*inputs).to("cuda"), make_padded_pretrain_batch(*inputs).to("cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        a, b = model.encoder(packed.docs), model.encoder(padded.docs)
        rows = padded.docs.real_rows()
        tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.05, rtol=0.05)
        torch.testing.assert_close(a.sentence_states.float(), b.sentence_states[rows].float(), **tol)
        torch.testing.assert_close(model(packed).loss, model(padded).loss, **tol)


def test_compiled_training_step_on_ragged_batches():
    torch.manual_seed(0)
    model = HibertForPretraining(CFG).cuda().train()
    compiled = torch.compile(model)
    for seed in range(3):  # three different shapes
        batch = make_pretrain_batch(*batch_inputs(seed)).to("cuda")
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(batch).loss
        loss.backward()
        assert torch.isfinite(loss)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
