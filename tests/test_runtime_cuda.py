"""The runtime's CUDA step: the switches that keep host syncs out of it and torch.compile of the layers
(`deepspeed.torch_compile`, inductor) compute what the eager step computes. Skipped where there is no GPU;
benchmarks/device_suite.sh runs it (step 5)."""
import pytest
import torch

from test_modeling_cuda import CFG, batch_inputs

from hibert.modeling import HibertForPretraining, make_pretrain_batch
from hibert.runtime.compile import compile_layers
from hibert.runtime.host_syncs import unscale_and_clip_grads

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_clipping_reads_nothing_back_from_the_device():
    from types import SimpleNamespace

    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    dev = torch.device("cuda")
    opt = SimpleNamespace(clip_grad=1.0, loss_scale=1.0, device=dev)
    for norm in (0.5, 4.0, float("nan")):
        ours, theirs = [torch.randn(1000, device=dev)], None
        theirs = [ours[0].clone()]
        total = torch.tensor(norm, device=dev)    # a host-to-device copy syncs: made before the check
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")   # any host sync in here raises
        try:
            unscale_and_clip_grads(opt, ours, total)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        DeepSpeedZeroOptimizer.unscale_and_clip_grads(opt, theirs, torch.tensor(norm, device=dev))
        assert torch.allclose(ours[0], theirs[0], rtol=0, atol=0, equal_nan=True), norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inductor_compiled_layers_match_eager(dtype):
    torch.manual_seed(0)
    eager = HibertForPretraining(CFG).cuda().train()
    compiled = HibertForPretraining(CFG).cuda().train()
    compiled.load_state_dict(eager.state_dict())
    compile_layers(compiled)
    losses = []
    for i, model in enumerate((eager, compiled)):
        for seed in (0, 1, 2):   # new token counts: recompiled once, then dynamic
            batch = make_pretrain_batch(*batch_inputs(seed)).to("cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                loss = model(batch).loss
            loss.backward()
            losses.append(loss.detach().float())
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(torch.stack(losses[3:]), torch.stack(losses[:3]), **tol)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name, **(tol if dtype == torch.float32 else
                                                                 dict(rtol=5e-2, atol=5e-3)))
