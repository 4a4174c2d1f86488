"""`bash benchmarks/device_suite.sh --dry-run`: the GPU machine's one command, every step on CPU with tiny sizes.
GPU machines are lent rarely; this keeps the command working between them — every step runs its code (the CUDA-only
parts say they were skipped and why), writes its JSON, and the summary and table come out."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

STEPS = ["environment", "pretrain", "profile", "loss_curve", "cuda_tests", "resume", "mds"]


def test_dry_run_writes_a_json_per_step_and_a_summary(tmp_path):
    out = tmp_path / "out"
    # the suite with this interpreter; $OUT (the device tool's) would take precedence over --out
    env = {k: v for k, v in os.environ.items() if k != "OUT"} | {"PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "device_suite.sh"), "--dry-run", "--out", str(out),
                           "--work", str(tmp_path / "work")], env=env, capture_output=True, text=True, timeout=370)
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    files = sorted(out.iterdir())
    assert all(f.is_file() for f in files) and len(files) <= 8, files   # flat, what the device tool brings back
    assert [f.name for f in files] == sorted([f"{i + 1}_{s}.json" for i, s in enumerate(STEPS)] + ["summary.json"])
    assert all(f.stat().st_size < 16_000 for f in files), [(f.name, f.stat().st_size) for f in files]

    summary = json.loads((out / "summary.json").read_text())
    # the budget holds the set-up and every step's box (a step is stopped inside its own)
    assert summary["dry_run"] and summary["total_s"] <= summary["budget_s"] + 5, summary["total_s"]
    assert [s["step"] for s in summary["steps"]] == STEPS
    for s in summary["steps"]:
        data = json.loads((out / s["file"]).read_text())
        assert data["status"] == s["status"]
        detail = f"{s['step']}: {data.get('reason')}\n{data.get('traceback') or data.get('log_tail') or log}"
        assert data["status"] in ("passed", "skipped"), detail
        if data["status"] == "skipped":
            assert data["reason"], detail
        machine = data["machine"]
        assert machine["dry_run"] and machine["torch"] and "deepspeed" in machine and "tree_digest" in machine
    assert proc.returncode == 0, log
    for name in STEPS:   # the printed table: a row per step
        assert any(line.startswith(name) for line in proc.stdout.splitlines()), proc.stdout[-3000:]

    steps = {s: json.loads((out / f"{i + 1}_{s}.json").read_text()) for i, s in enumerate(STEPS)}
    environment = steps["environment"]
    assert environment["setup"]["link_tree"], environment["setup"]   # the bare device's import path
    assert environment["toolchain"]["triton"] and "c_compiler" in environment["toolchain"]
    assert environment["compile_probe"]["status"] == "skipped" and environment["compile_probe"]["reason"]
    assert steps["cuda_tests"]["reason"].startswith("no CUDA") and steps["cuda_tests"]["counts"]["skipped"] > 0
    pretrain = steps["pretrain"]
    assert pretrain["peak"]["tflops"] is None and pretrain["peak"]["rule"]   # no GPU: no MFU, and why
    runs = pretrain["runs"]
    assert list(runs) == ["zero1", "zero1-compiled", "zero2"], list(runs)   # the compiled run before ZeRO-2
    tuned = {"deepspeed.torch_compile": True, "deepspeed.check_finite_grads": False}
    assert runs["zero1-compiled"]["switches"] == tuned
    for name, run in runs.items():
        assert run["exit"] == 0 and run["tokens_per_s"] > 0 and run["exported"] and run["checkpoint"], (name, run)
        # the steady state from the per-step record: at least two windows, none holding a log step
        assert run["steady_windows"] >= 2 and run["steady"]["tokens_per_s"] > 0, (name, run["timed_windows"])
        assert run["timed_windows"][0]["excluded"] == "warm-up"
    compiled = runs["zero1-compiled"]["dynamo"]
    assert compiled["frames_compiled"] > 0 and compiled["unique_graphs"] > 0 and "recompiles" in compiled
    assert runs["zero1"]["dynamo"] is None
    # the committed CPU reference reproduces on CPU (same data, masks and initial weights)
    curve = steps["loss_curve"]
    assert curve["fingerprint"] == curve["reference_fingerprint"]
    assert curve["fp32_vs_reference_max_rel"] < 1e-3
    assert curve["matmul_precision"]["fp32"]["float32_matmul_precision"] == "highest"
    assert curve["matmul_precision"]["fp32"]["env"]["NVIDIA_TF32_OVERRIDE"] == "0"
    assert curve["fp32_comparison"]["does_not_catch"]
    assert steps["resume"]["weights_bit_identical"] and steps["resume"]["resumed_at"] == 4
