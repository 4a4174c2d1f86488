"""The CUDA path of decoding (modeling/kv_cache.py, modeling/generate.py, modeling/logits_process.py): the
KV cache's ancestry mask through the fused SDPA kernel, the CUDA branches of the n-gram blocker (masks instead
of host syncs) and the device-resident beam pool must decode what the CPU decodes. Skipped where there is no GPU."""
import copy

import numpy as np
import pytest
import torch

from hibert.config.abstractive import GenerationConfig
from hibert.modeling.generate import generate
from hibert.modeling.packing import pack_documents
from hibert.tokens import BOS_ID
from test_modeling_abstractive import V, favour_eos, random_docs, tiny_model
from test_modeling_generate import WORD_START

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _decode_with_reorders(model, docs, device: str, dtype: torch.dtype, k: int = 3, steps: int = 6) -> list[torch.Tensor]:
    """Step-by-step log-probs [rows, V] of K beams per document under random backpointers within each
    document, the middle document dropped after step 2 (the same random choices on every device)."""
    rng = np.random.default_rng(1)
    history = torch.full((len(docs) * k, 1), BOS_ID)
    out, b = [], len(docs)
    with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
        state = model.start_decoding(pack_documents(docs).to(device), beams=k, max_len=steps + 1)
        for t in range(steps):
            out.append(model.decode_step(history[:, -1].to(device), state).float().cpu())
            rows = (torch.arange(b)[:, None] * k + torch.as_tensor(rng.integers(0, k, (b, k)))).flatten()
            history = torch.cat([history[rows], torch.as_tensor(rng.integers(6, V, (b * k, 1)))], 1)
            if t == 2:
                kept = torch.tensor([0, 2])
                rows = rows.view(b, k)[kept].flatten()
                history = history.view(b, k, -1)[kept].flatten(0, 1)
                state.reorder(rows.to(device), keep_docs=kept.to(device))
                b = 2
            else:
                state.reorder(rows.to(device))
    return out


@pytest.mark.parametrize("cross,copy_", [("flat", False), ("flat", "coverage"), ("pht", True), ("vht", False)])
def test_cuda_cache_follows_reorders_like_the_cpu(cross, copy_):
    docs = random_docs(8, n_docs=3)
    cpu = tiny_model(cross, copy_)
    gpu = copy.deepcopy(cpu).cuda()
    want = _decode_with_reorders(cpu, docs, "cpu", torch.float32)
    got = _decode_with_reorders(gpu, docs, "cuda", torch.float32)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    # bf16 autocast (the mask in the kernel's dtype): close to fp32, the same best token in almost every row
    low = _decode_with_reorders(gpu, docs, "cuda", torch.bfloat16)
    for g, w in zip(low, want):
        assert not torch.isnan(g).any() and not (g == float("inf")).any()
        torch.testing.assert_close(g, w, atol=0.15, rtol=0.05)
    agree = torch.cat([(g.argmax(-1) == w.argmax(-1)) for g, w in zip(low, want)]).float().mean().item()
    assert agree > 0.9, agree


@pytest.mark.parametrize("cross,copy_", [("flat", False), ("pht", True)])
def test_cuda_beam_search_decodes_what_the_cpu_decodes(cross, copy_):
    """Beam 4, word-trigram blocking, documents finishing at different steps: the same tokens and scores
    (fp32), and under bf16 autocast a search that keeps its length bounds and its finite scores."""
    cpu = favour_eos(tiny_model(cross, copy_, seed=4), 2.0)
    gpu = copy.deepcopy(cpu).cuda()
    docs = random_docs(20, n_docs=8, max_sents=6, max_words=14)
    cfg = GenerationConfig(beam_size=4, min_length=2, max_length=12, no_repeat_ngram=3)
    with torch.no_grad():
        want = generate(cpu, pack_documents(docs), cfg, word_start=WORD_START)
        got = generate(gpu, pack_documents(docs).to("cuda"), cfg, word_start=WORD_START.cuda())
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert max(abs(g.score - w.score) for g, w in zip(got, want)) < 1e-4
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        low = generate(gpu, pack_documents(docs).to("cuda"), cfg, word_start=WORD_START.cuda())
    assert all(2 <= len(h.tokens) <= 12 and np.isfinite(h.score) for h in low)
