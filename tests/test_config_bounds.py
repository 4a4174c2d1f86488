"""Bad values are one-line errors naming the key, exit 2, before any work — through --print-config and
through every real command (the config is checked before a handler is even imported)."""
import os
import subprocess
import sys

import pytest

from hibert.cli import main

BAD = [  # override, what the one-line error must say
    ("schedule.epochs=0", "schedule.epochs"),
    ("schedule.max_steps=0", "schedule.max_steps"),
    ("checkpoint.keep_last=0", "checkpoint.keep_last"),
    ("checkpoint.keep_last=-2", "checkpoint.keep_last"),
    ("model.heads=0", "model.heads"),
    ("model.heads=7", "model.hidden (128) must be divisible by model.heads (7)"),
    ("model.hidden=-64", "model.hidden"),
    ("model.dropout=1.0", "model.dropout"),
    ("model.max_positions=40", "model.max_positions (40) must cover data.max_sentence_tokens + 1 (51)"),
    ("schedule.log_every=0", "schedule.log_every"),
    ("schedule.grad_accum=0", "schedule.grad_accum"),
    ("schedule.warmup_steps=-10", "schedule.warmup_steps"),
    ("schedule.decay=linear", "schedule.decay=linear needs a horizon: set schedule.max_steps"),
    ("schedule.batch_tokens=0", "schedule.batch_tokens"),
    ("optimizer.lr=-1", "optimizer.lr: Input should be greater than or equal to 0"),
    ("optimizer.betas=[0.9,3]", "optimizer.betas.1"),
    ("optimizer.eps=0", "optimizer.eps"),
    ("deepspeed.extra.zero_optimization.stage=7", "deepspeed.extra.zero_optimization.stage must be 0, 1, 2 or 3"),
    ("deepspeed.extra.gradient_accumulation_steps=4", "use schedule.grad_accum"),
    ("deepspeed.extra.checkpoint.writer.decoupled=true", "deepspeed.extra.checkpoint.writer.decoupled is not supported"),
    ("deepspeed.extra.datastates_ckpt.enabled=true", "deepspeed.extra.datastates_ckpt is not supported"),
    ("deepspeed.offload_param=cpu", "deepspeed.offload_param needs deepspeed.zero_stage=3"),
    ("objective.select_ratio=0", "objective.select_ratio"),
    ("objective.max_selected=0", "objective.max_selected"),
    ("data.workers=0", "data.workers"),
    ("data.tokenizer.vocab_size=4", "data.tokenizer.vocab_size"),
    ("run.name=../escape", "run.name"),
    ("tracking.alias=latest", "reserved by MLflow"),
]


@pytest.mark.parametrize("override,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_value_is_one_line_naming_the_key(override, needle, capsys):
    assert main(["pretrain", "demo", override, "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize("command", ["prep", "pretrain", "finetune", "evaluate", "summarize", "submit"])
def test_every_command_refuses_before_any_work(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([command, "demo", "schedule.epochs=0", "checkpoint.keep_last=0"]) == 2
    err = capsys.readouterr().err
    assert "schedule.epochs" in err and "checkpoint.keep_last" in err
    assert list(tmp_path.iterdir()) == []  # no run dir, no store, no data


def test_real_process_exits_2_with_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-m", "hibert.cli", "pretrain", "demo", "model.heads=0"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "hibert pretrain: invalid config (demo + overrides ['model.heads=0']): "
        "model.heads: Input should be greater than or equal to 1 (got 0)"]
    assert list(tmp_path.iterdir()) == []


def test_good_edge_values_still_load():
    from hibert.config import load_config

    cfg = load_config("demo", ["schedule.decay=linear", "schedule.max_steps=100", "schedule.warmup_steps=0",
                               "checkpoint.keep_last=1", "checkpoint.every_steps=0", "schedule.eval_every=0",
                               "checkpoint.keep_best=0", "optimizer.grad_clip=0", "deepspeed=zero3",
                               "deepspeed.offload_param=cpu"])
    assert cfg.schedule.max_steps == 100 and cfg.deepspeed.zero_stage == 3


def test_model_sizes_are_bounded_and_checked_against_the_weights_before_anything_is_built(tmp_path):
    """model.json with layers=10**6 allocated 3.4 GB before any shape was compared; hidden, vocab_size and
    max_positions of 10**9 ended in allocator tracebacks: sizes are bounded at load, and an export's model.json
    must describe its weights' header (read without loading the tensors) before a model is built."""
    import json

    import torch
    from safetensors.torch import save_file

    from hibert.config.model import ModelConfig
    from hibert.errors import UserError
    from hibert.modeling.encoder import HibertEncoder
    from hibert.runtime.export import read_export

    for key, value in (("layers", 10**6), ("hidden", 10**9), ("vocab_size", 10**10), ("max_positions", 10**9)):
        with pytest.raises(ValueError, match=key):
            ModelConfig(**{key: value})
    cfg = ModelConfig(vocab_size=64, hidden=16, heads=2, layers=1, max_positions=32)
    save_file(HibertEncoder(cfg).state_dict(), str(tmp_path / "encoder.safetensors"))
    (tmp_path / "model.json").write_text(json.dumps(cfg.model_dump(mode="json")))
    state, got, _ = read_export(tmp_path)
    assert got == cfg and set(state) == set(HibertEncoder(cfg).state_dict())
    (tmp_path / "model.json").write_text(json.dumps({**cfg.model_dump(mode="json"), "layers": 200, "hidden": 4096,
                                                     "heads": 16}))
    with pytest.raises(UserError, match=r"model.json does not describe .*encoder.safetensors"):
        read_export(tmp_path)
    assert not any(t.is_meta for t in state.values()) and torch.is_tensor(next(iter(state.values())))
