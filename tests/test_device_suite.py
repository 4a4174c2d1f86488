"""`bash benchmarks/device_suite.sh --dry-run`: the GPU machine's one command, every step on CPU with tiny sizes.
GPU machines are lent rarely; this keeps the command working between them — every step runs its code (the CUDA-only
parts say they were skipped and why), writes its JSON, and the summary and table come out."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]

STEPS = ["environment", "cuda_tests", "pretrain", "loss_curve", "profile", "resume", "mds"]


def test_dry_run_writes_a_json_per_step_and_a_summary(tmp_path):
    out = tmp_path / "out"
    # the suite with this interpreter; $OUT (the device tool's) would take precedence over --out
    env = {k: v for k, v in os.environ.items() if k != "OUT"} | {"PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "device_suite.sh"), "--dry-run", "--out", str(out),
                           "--work", str(tmp_path / "work")], env=env, capture_output=True, text=True, timeout=330)
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    files = sorted(out.iterdir())
    assert all(f.is_file() for f in files) and len(files) <= 8, files   # flat, what the device tool brings back
    assert [f.name for f in files] == sorted([f"{i + 1}_{s}.json" for i, s in enumerate(STEPS)] + ["summary.json"])
    assert all(f.stat().st_size < 16_000 for f in files), [(f.name, f.stat().st_size) for f in files]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["total_s"] < 300, summary["total_s"]
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
    assert steps["environment"]["setup"]["link_tree"], steps["environment"]["setup"]   # the bare device's import path
    assert steps["cuda_tests"]["reason"].startswith("no CUDA") and steps["cuda_tests"]["counts"]["skipped"] > 0
    runs = steps["pretrain"]["runs"]
    assert list(runs) == ["zero1", "zero2", "zero1-compiled"], list(runs)
    assert runs["zero1-compiled"]["switches"] == {"deepspeed.torch_compile": True, "deepspeed.check_finite_grads": False}
    for run in runs.values():
        assert run["exit"] == 0 and run["tokens_per_s"] > 0 and run["exported"] and run["checkpoint"]
    # the committed CPU reference reproduces on CPU (same data, masks and initial weights)
    assert steps["loss_curve"]["fingerprint"] == steps["loss_curve"]["reference_fingerprint"]
    assert steps["loss_curve"]["fp32_vs_reference_max_rel"] < 1e-3
    assert steps["resume"]["weights_bit_identical"] and steps["resume"]["resumed_at"] == 4
