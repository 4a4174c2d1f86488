"""The device suite's parts that decide what a GPU window brings back, without running the suite: the budget and
the order of the steps, the set-up's fallback when pip is missing or fails, the peak TFLOP/s MFU is counted
against, and the steady-state windows (benchmarks/device_suite.py, device_mfu.py, timed_run.py)."""
import json
import os
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import device_mfu  # noqa: E402  (standard library only)
import device_suite  # noqa: E402  (standard library only at its top)

pytestmark = pytest.mark.timeout(300)


# ------------------------------------------------------------------------------------------ budget and order
@pytest.mark.parametrize("dry_run", [False, True])
def test_step_boxes_and_the_setup_fit_the_budget(dry_run):
    budget = device_suite.DRY_BUDGET_S if dry_run else device_suite.DEVICE_BUDGET_S
    setup = device_suite.DRY_SETUP_BOX_S if dry_run else device_suite.SETUP_BOX_S
    boxes = [device_suite.step_box(s, dry_run) for s in device_suite.STEPS]
    assert setup + sum(boxes) <= budget, (setup, boxes, budget)
    assert all(s.min_s <= device_suite.step_box(s, dry_run) for s in device_suite.STEPS)
    if not dry_run:
        assert budget <= 420


def test_the_numbers_come_first_and_the_cuda_tests_after_them():
    names = [s.name for s in device_suite.STEPS]
    assert names[:3] == ["environment", "pretrain", "profile"]
    assert names.index("cuda_tests") > names.index("loss_curve")
    assert [s.file for s in device_suite.STEPS][:2] == ["1_environment.json", "2_pretrain.json"]


def test_each_step_gets_its_box_and_what_an_earlier_one_left():
    steps, budget = device_suite.STEPS, device_suite.DEVICE_BUDGET_S
    # every earlier step (and the set-up) used its whole box: each step gets exactly its own
    used = device_suite.SETUP_BOX_S
    for s in steps:
        box = device_suite.box_now(s, steps, budget - used, dry_run=False)
        assert box == pytest.approx(s.box_s)
        used += box
    assert used <= budget
    # the set-up and the environment ended early: the next step gets their time, the later ones keep theirs
    left = budget - 5 - 10
    assert device_suite.box_now(steps[1], steps, left, False) == pytest.approx(
        steps[1].box_s + (device_suite.SETUP_BOX_S - 5) + (steps[0].box_s - 10))
    # --only: the steps that will not run reserve nothing
    only = [steps[1], steps[2]]
    assert device_suite.box_now(steps[1], only, budget, False) == budget - steps[2].box_s


# ------------------------------------------------------------------------------------------ set-up fallback
def tiny_wheel(folder, name="tinypkg", metadata=True):
    """A wheel as PEP 427 lays it out: the package at the top, a purelib file under .data, a script (not imported)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", "VALUE = 41\n")
        z.writestr(f"{name}-0.1.data/purelib/{name}_extra.py", "VALUE = 1\n")
        z.writestr(f"{name}-0.1.data/scripts/{name}-cli", "#!/bin/sh\n")
        if metadata:
            z.writestr(f"{name}-0.1.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
            z.writestr(f"{name}-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            z.writestr(f"{name}-0.1.dist-info/RECORD", "")
    return path


def imports_from(site, code):
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd="/",
                          timeout=240)


def test_wheels_are_unpacked_where_pip_is_missing(tmp_path):
    tiny_wheel(tmp_path / "whl")
    no_pip = tmp_path / "python-without-pip"
    no_pip.write_text("#!/bin/sh\necho 'No module named pip' >&2\nexit 1\n")
    no_pip.chmod(0o755)
    rec = device_suite.install_wheels(tmp_path / "whl", tmp_path / "site", timeout=30, python=str(no_pip))
    assert rec["installer"] == "unpacked" and "No module named pip" in rec["pip_failed"], rec
    assert rec["files"] == 5 and not (tmp_path / "site" / "tinypkg-cli").exists()   # scripts are not imported
    out = imports_from(tmp_path / "site", "import importlib.metadata as m, tinypkg, tinypkg_extra; "
                                          "print(tinypkg.VALUE + tinypkg_extra.VALUE, m.version('tinypkg'))")
    assert out.stdout.strip() == "42 0.1", out.stderr   # the package, its purelib file and its version


def test_a_pip_that_fails_or_hangs_does_not_stop_the_set_up(tmp_path):
    tiny_wheel(tmp_path / "whl", metadata=False)   # no .dist-info: pip refuses it, its files still unpack
    rec = device_suite.install_wheels(tmp_path / "whl", tmp_path / "site", timeout=200)
    assert rec["installer"] == "unpacked" and rec["pip_failed"].startswith("pip exited"), rec
    slow = tmp_path / "python-slow"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    rec = device_suite.install_wheels(tmp_path / "whl", tmp_path / "site2", timeout=1, python=str(slow))
    assert rec["installer"] == "unpacked" and "did not finish" in rec["pip_failed"], rec
    rec = device_suite.install_wheels(tmp_path / "nothing", tmp_path / "site3", timeout=1)
    assert rec["installer"] is None and "no .whl" in rec["error"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_suite_writes_its_json_when_pip_fails(tmp_path):
    """A set-up that fails is recorded and the suite goes on: the environment step's JSON and summary.json say so."""
    tiny_wheel(tmp_path / "whl", metadata=False)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "device_suite.py"), "--dry-run", "--only",
                           "environment", "--wheels", str(tmp_path / "whl"), "--out", str(out), "--work",
                           str(tmp_path / "work")], env=env, capture_output=True, text=True, timeout=280)
    log = proc.stdout[-3000:] + proc.stderr[-3000:]
    environment = json.loads((out / "1_environment.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert environment["status"] == "passed", (environment.get("reason"), log)
    wheels = environment["setup"]["wheels"]
    assert wheels["installer"] == "unpacked" and wheels["pip_failed"], wheels
    assert "pip failed" in environment["headline"]
    assert summary["setup"]["wheels"]["installer"] == "unpacked"
    assert environment["toolchain"]["triton"] and "python_headers" in environment["toolchain"]
    assert environment["compile_probe"]["status"] == "skipped" and environment["compile_probe"]["reason"]


def test_the_compile_probe_is_stopped_at_its_box():
    probe = device_suite.Probe("import time; time.sleep(30)", dict(os.environ), timeout=1)
    result = probe.result()
    assert result["status"] == "timed_out" and result["seconds"] < 10
    assert device_suite.Probe("print('{\"status\": \"compiled\"}')", dict(os.environ), 30).result() == {
        "status": "compiled"}


# ------------------------------------------------------------------------------------------ peak TFLOP/s
@pytest.mark.parametrize("name, memory, sms, gpu, tflops", [
    ("NVIDIA H200", 139.8, 132, "H200 SXM", 989.0),
    ("NVIDIA H200 NVL", 139.8, 132, "H200 NVL", 835.0),
    ("NVIDIA GH200 480GB", 94.5, 132, "GH200", 989.0),
    ("NVIDIA H100 80GB HBM3", 79.1, 132, "H100 SXM", 989.0),
    ("NVIDIA H100 PCIe", 79.1, 114, "H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", 93.1, 132, "H100 NVL", 835.0),
    ("NVIDIA H100", 93.1, 132, "H100 NVL", 835.0),      # the name alone does not say: the memory does
    ("NVIDIA H100", 79.1, 114, "H100 PCIe", 756.0),     # nor the memory: the SM count does
    ("NVIDIA H100", 79.1, 132, "H100 SXM", 989.0),
    ("NVIDIA H20", 95.0, 78, "H20", 148.0),
    ("NVIDIA A100-SXM4-80GB", 79.2, 108, "A100", 312.0),
    ("NVIDIA A10", 22.0, 72, "A10", 125.0),
    ("NVIDIA L40S", 44.4, 142, "L40S", 362.0),
    ("NVIDIA L4", 22.0, 58, "L4", 121.0),
])
def test_peak_tflops_tells_the_parts_apart(name, memory, sms, gpu, tflops):
    peak = device_mfu.peak_tflops(name, memory, sms)
    assert (peak["gpu"], peak["tflops"]) == (gpu, tflops), peak
    assert peak["rule"] and peak["name"] == name and peak["memory_gib"] == memory


def test_an_unknown_gpu_has_no_peak_and_says_why():
    peak = device_mfu.peak_tflops("Tesla T4", 14.6, 40)
    assert peak["tflops"] is None and "Tesla T4" in peak["rule"]


@pytest.mark.parametrize("name, memory_gib, sms, tflops", [
    ("NVIDIA H200 NVL", 139.8, 132, 835.0), ("NVIDIA H200", 139.8, 132, 989.0), ("NVIDIA H100", 93.1, 132, 835.0),
    ("Tesla T4", 14.6, 40, None)])
def test_the_runtime_counts_mfu_against_the_suites_peak(monkeypatch, name, memory_gib, sms, tflops):
    """The MFU a run logs without tracking.peak_tflops uses the suite's rules (an H200 NVL is not an SXM part)."""
    import types

    import torch

    from hibert.runtime.metrics import default_peak_tflops

    props = types.SimpleNamespace(name=name, total_memory=int(memory_gib * 2**30), multi_processor_count=sms)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    assert default_peak_tflops(torch.device("cuda"), None) == tflops
    assert default_peak_tflops(torch.device("cuda"), 123.0) == 123.0
    assert default_peak_tflops(torch.device("cpu"), None) is None
    assert device_mfu.peak_tflops(name, memory_gib, sms)["tflops"] == tflops


# ------------------------------------------------------------------------------------------ steady windows
def steps_of(n, log_every, step_s=0.1, log_s=0.5, warm_s=2.0, tokens=1000, flops=1e12, gpu=False, changes=None):
    """Per-step records as timed_run.py writes them: each step `step_s`, the step after a log step `log_s` more
    (the step log's syncs and sqlite write), the first steps `warm_s`."""
    t, out = 0.0, []
    for i in range(1, n + 1):
        t += step_s + (warm_s if i <= 2 else 0) + (log_s if i > 1 and (i - 1) % log_every == 0 else 0)
        rec = {"step": i, "epoch": 0, "host_s": t, "tokens": tokens, "flops": flops, "wait_s": 0.01}
        if gpu:
            rec["gpu_s"] = t / 2   # another clock: the GPU's
        rec.update((changes or {}).get(i, {}))
        out.append(rec)
    return out


def test_steady_windows_leave_out_the_logging_and_the_warm_up():
    steps = steps_of(50, 10)
    timing = device_mfu.steady_windows(steps, 10, peak=100.0)
    steady = timing["steady"]
    assert timing["steady_windows"] == 4 and timing["clock"] == "host_s"
    assert steady["tokens_per_s"] == pytest.approx(1000 / 0.1)      # the logging steps are not in it
    assert steady["mfu"] == pytest.approx(1e12 / 0.1 / 100e12)
    assert steady["timed_steps"] == 4 * 9 and steady["spread"] == pytest.approx(0, abs=1e-6)
    assert timing["windows"][0]["excluded"] == "warm-up"
    # the run's own logged window (from one log step to the next) holds the logging: lower by log_s / 10 steps
    logged = 10 * 1000 / (steps[29]["host_s"] - steps[19]["host_s"])
    assert logged == pytest.approx(1000 / (0.1 + 0.05)) and logged < steady["tokens_per_s"]


def test_windows_that_compile_cross_an_epoch_or_were_cut_are_not_steady():
    compiled = {25: {"dynamo": {"frames_compiled": 3}}, 31: {"dynamo": {"frames_compiled": 4}}}
    steps = steps_of(57, 10, changes=compiled)
    for i in range(45, 58):
        steps[i - 1]["epoch"] = 1
    timing = device_mfu.steady_windows(steps, 10, peak=None)
    why = [w["excluded"] for w in timing["windows"]]
    # a compile in a window's first step is outside its timed interval (window 4); step 57 is the last recorded
    assert why == ["warm-up", None, "compiled during it", None, "epoch boundary (the loader restarts)",
                   "incomplete"]
    assert timing["steady_windows"] == 2 and timing["steady"]["tokens_per_s"] == pytest.approx(1000 / 0.1)
    short = device_mfu.steady_windows(steps_of(15, 10), 10, peak=None)
    assert short["steady"] is None and short["reason"].startswith("0 steady window")


def test_the_gpu_clock_is_used_where_every_step_has_it():
    timing = device_mfu.steady_windows(steps_of(30, 10, gpu=True), 10, peak=None)
    assert timing["clock"] == "gpu_s"
    assert timing["steady"]["tokens_per_s"] == pytest.approx(1000 / 0.05)
    assert timing["steady"]["mfu"] is None


def test_a_record_cut_by_a_kill_is_read_up_to_its_last_whole_line(tmp_path):
    path = tmp_path / "steps.jsonl"
    lines = [{"precision": {"float32_matmul_precision": "highest"}}, *steps_of(3, 10)]
    lines[2]["dynamo"] = {"recompiles": 2}
    path.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"step": 4, "epo')
    steps, info = device_mfu.read_record(path)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert info["precision"]["float32_matmul_precision"] == "highest" and info["dynamo"] == {"recompiles": 2}


def test_a_stopped_runs_windows_are_read_from_its_log_lines(tmp_path):
    from hibert.runtime.step_log import StepLog

    log = StepLog(60, 0, enabled=True)
    lines = [log.line(10, {"train_loss": 7.5, "tokens_per_s": 512345.6, "mfu": 0.3141, "data_wait_fraction": 0.021,
                           "steps_per_s": 3.2, "lr": 1e-4}),
             "eval step 10/60 valid_loss=7.4",
             log.line(20, {"train_loss": 7.1, "tokens_per_s": 600000.0, "steps_per_s": 3.3})]
    path = tmp_path / "run.log"
    path.write_text("\n".join(f"2026-01-01 00:00:00,000 [rank0] hibert.train: {x}" for x in lines) + "\n")
    got = device_mfu.logged_lines(path)
    assert got["tokens_per_s"] == [(10, 512346.0), (20, 600000.0)]
    assert got["mfu"] == [(10, pytest.approx(0.314))] and got["data_wait_fraction"] == [(10, pytest.approx(0.021))]


# ------------------------------------------------------------------------------------------ fp32 pinning
def test_tf32_is_seen_in_a_precision_state():
    from timed_run import tf32_possible

    pinned = {"float32_matmul_precision": "highest", "cuda_matmul_allow_tf32": False,
              "env": {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": None, "NVIDIA_TF32_OVERRIDE": "0"}}
    assert not tf32_possible(pinned)
    assert tf32_possible({**pinned, "float32_matmul_precision": "high"})
    assert tf32_possible({**pinned, "env": {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1", "NVIDIA_TF32_OVERRIDE": "0"}})
    assert tf32_possible({**pinned, "env": {}})   # the cuBLAS override not set: the library's default decides


def test_pin_fp32_pins_the_process():
    code = ("import os, json, timed_run; os.environ['TORCH_ALLOW_TF32_CUBLAS_OVERRIDE'] = '1'; "
            "import torch; torch.set_float32_matmul_precision('high'); timed_run.pin_fp32(); "
            "print(json.dumps(timed_run.precision_state()))")
    env = {**os.environ, "PYTHONPATH": str(REPO / "benchmarks")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    state = json.loads(out.stdout.strip().splitlines()[-1])
    assert state == {"float32_matmul_precision": "highest", "cuda_matmul_allow_tf32": False,
                     "cudnn_allow_tf32": False,
                     "env": {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": None, "NVIDIA_TF32_OVERRIDE": "0"}}, out.stderr


# ------------------------------------------------------------------------------------------ a stopped run
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_run_stopped_at_its_deadline_keeps_what_it_logged(tmp_path, tiny_data, monkeypatch):
    """As step 2 does to a run whose cold compile outlasts its share of the box: stopped, then read — its MLflow
    windows, its per-step record (steady windows) and, where the store cannot be read, its log lines."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    import dataclasses
    import time

    import device_steps

    ctx = device_suite.Context(tmp_path / "out", tmp_path / "work", True, time.time() + 360)
    (ctx.work / "logs").mkdir(parents=True)
    s = dataclasses.replace(device_steps.DRY, steps=500, log_every=3)
    root = ctx.work / "runs" / "stopped"
    proc, log, rec = device_steps.start(ctx, root, "zero1", tiny_data["open"], device_steps.speed_settings(s, 1),
                                        record=True)
    while proc.poll() is None and time.time() < ctx.deadline - 30:   # three windows logged, then the deadline
        if len(device_mfu.read_record(rec)[0]) >= 10:
            break
        time.sleep(0.5)
    code = device_steps.finish_run(proc, deadline=time.time())
    run = device_steps.Run(root, "zero1", code, 0.0, log, rec)
    got = device_steps.speed_numbers(run, s, peak=None)
    assert code is None and got["stopped_at_deadline"] and not got["exported"], log.read_text()[-2000:]
    assert got["logged_from"] == "mlflow" and len(got["windows_tokens_per_s"]) >= 3, got
    assert got["steady_windows"] >= 2 and got["steady"]["tokens_per_s"] > 0, got["timed_windows"]
    (root / "mlflow.db").write_bytes(b"not a database")   # a store the kill left unreadable
    again = device_steps.speed_numbers(run, s, peak=None)
    assert again["logged_from"].startswith("log lines"), again["logged_from"]
    shared = set(again["windows_tokens_per_s"]) & set(got["windows_tokens_per_s"])
    assert len(shared) >= 3 and all(again["windows_tokens_per_s"][k] == got["windows_tokens_per_s"][k]
                                    for k in shared)


def test_the_gpu_clock_is_read_once_the_gpu_has_passed_a_step(tmp_path, monkeypatch):
    """timed_run.py on CUDA: an event after each step, a step's line written when the GPU has passed its event
    (query, no sync), the rest at the end; GPU seconds are counted from the first step's event."""
    import torch
    import timed_run

    class Event:   # torch.cuda.Event's interface, on a clock the test moves
        now, passed = 0.0, 0.0

        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            self.t = Event.now

        def query(self):
            return self.t <= Event.passed

        def synchronize(self):
            Event.passed = max(Event.passed, self.t)

        def elapsed_time(self, end):
            return (end.t - self.t) * 1000

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    path = tmp_path / "steps.jsonl"
    record = timed_run.StepRecord(str(path), timed_run.RecompileLog())
    Event.passed = -1.0
    for step in (1, 2, 3):
        Event.now = 10.0 + step / 2
        record.step({"step": step, "host_s": step})
    assert device_mfu.read_record(path)[0] == []   # the GPU has passed none of them: nothing waited for
    Event.passed = 11.0
    record.drain(wait=False)
    assert [(s["step"], s["gpu_s"]) for s in device_mfu.read_record(path)[0]] == [(1, 0.0), (2, 0.5)]
    record.close()
    assert [(s["step"], s["gpu_s"]) for s in device_mfu.read_record(path)[0]] == [(1, 0.0), (2, 0.5), (3, 1.0)]
