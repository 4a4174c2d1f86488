"""Per-rank RNG state (python, numpy, torch, cuda) saved as safetensors + JSON metadata — no pickles."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def save_rng_state(path: Path) -> None:
    py = random.getstate()
    np_state = np.random.get_state()
    tensors = {
        "python": torch.tensor(py[1], dtype=torch.int64),
        "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda_{i}"] = s
    meta = {"python_version": json.dumps(py[0]), "python_gauss": json.dumps(py[2]),
            "numpy": json.dumps([np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])])}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)


def load_rng_state(path: Path) -> None:
    t = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    random.setstate((json.loads(meta["python_version"]), tuple(int(x) for x in t["python"].tolist()),
                     json.loads(meta["python_gauss"])))
    name, pos, has_gauss, cached = json.loads(meta["numpy"])
    np.random.set_state((name, t["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(t["torch"])
    cuda = sorted(k for k in t if k.startswith("cuda_"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t[k] for k in cuda])
