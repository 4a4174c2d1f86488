"""`deepspeed.torch_compile`: torch.compile each Transformer layer in place, as torchtitan compiles each
block. Per layer rather than the whole model: the layers are identical, so one compiled graph serves all of
them, and the packing and loss code around them (data-dependent shapes) stays eager. `nn.Module.compile`
keeps the parameters' names, so checkpoints and exports are the same with and without it."""
from __future__ import annotations

import torch

from hibert.modeling.layers import TransformerLayer


def compile_layers(model: torch.nn.Module, backend: str = "inductor") -> int:
    """Compile every TransformerLayer of `model` (encoders, the pretraining decoder, abstractive decoders).
    Shapes change with every packed batch: `dynamic=None` lets torch mark them dynamic after the first
    recompile instead of compiling every new token count. Returns how many layers."""
    layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    for layer in layers:
        layer.compile(backend=backend, dynamic=None)
    return len(layers)
