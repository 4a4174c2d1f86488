"""`hibert pretrain` for real: DeepSpeed ZeRO on 2 CPU ranks (gloo), checkpoints, resume, preemption,
registry stages. Every multi-process step has a hard timeout."""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import HIBERT, run_hibert, tiny_train_overrides

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def encoder_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "export" / "encoder.safetensors"))


def _without_key_bias(name: str, t: torch.Tensor) -> torch.Tensor:
    # The key projection's bias has an exactly zero true gradient (softmax ignores a shift shared by all
    # keys), so Adam turns float reduction-order noise there into lr-sized updates: it cannot be compared
    # across different reduction orders. Every other weight can.
    if name.endswith("qkv.bias"):
        h = t.shape[0] // 3
        return torch.cat([t[:h], t[2 * h:]])
    return t


def assert_same(a: dict, b: dict, exact: bool = True, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), f"{k} differs"
        else:
            torch.testing.assert_close(_without_key_bias(k, a[k]), _without_key_bias(k, b[k]), atol=atol, rtol=0,
                                       msg=lambda m: f"{k} differs: {m}")


def _history(run_root: Path, run_name: str, key: str) -> list:
    from hibert.registry import client

    c = client(f"sqlite:///{run_root / 'mlflow.db'}")
    exp = c.get_experiment_by_name("hibert")
    runs = c.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{run_name}'")
    assert runs, f"no MLflow run named {run_name}"
    return sorted(c.get_metric_history(runs[0].info.run_id, key), key=lambda m: m.step)


def metric_history(run_root: Path, run_name: str, key: str) -> list[float]:
    """Every value MLflow holds for `key` of the run, in step order (a step logged twice counts twice)."""
    return [m.value for m in _history(run_root, run_name, key)]


def logged_by_step(run_root: Path, run_name: str, key: str) -> dict[int, float]:
    """The same by step."""
    return {m.step: m.value for m in _history(run_root, run_name, key)}


REF_SCHEDULE = {"schedule.max_steps": 8, "schedule.log_every": 3}


@pytest.fixture(scope="module")
def reference_run(tiny_data, tmp_path_factory):
    """An uninterrupted 2-rank ZeRO-2 run of 8 steps: the reference for resume and preemption tests. Metrics
    every 3 steps, checkpoints every 2: a checkpoint off the logging cadence holds steps not yet logged."""
    root = tmp_path_factory.mktemp("ref")
    run_hibert(["pretrain", *tiny_train_overrides(root, "ref", tiny_data["open"], **REF_SCHEDULE),
                "--stage", "open-domain", "--nproc", "2"], timeout=300)
    return root / "ref"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_trains_and_loss_falls(tiny_data, tmp_path, stage):
    run_hibert(["pretrain", *tiny_train_overrides(tmp_path, f"z{stage}", tiny_data["open"], **{
        "deepspeed.zero_stage": stage, "schedule.max_steps": 16, "checkpoint.every_steps": 0,
        "tracking.register_model": "false"}), "--nproc", "2"], timeout=300)
    losses = metric_history(tmp_path, f"z{stage}", "train_loss")
    assert len(losses) == 16
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.3, losses
    assert (tmp_path / f"z{stage}" / "export" / "encoder.safetensors").is_file()
    assert not list((tmp_path / f"z{stage}").glob("launch-*"))   # the ranks' resolved config (credentials) is gone


def test_two_ranks_equal_one_process_on_the_same_global_batch(tiny_data, tmp_path, reference_run):
    # reference: 2 ranks x 1 micro-batch; here: 1 rank x 2 accumulated micro-batches = same global batch
    run_hibert(["pretrain", *tiny_train_overrides(tmp_path, "single", tiny_data["open"], **{
        "schedule.max_steps": 8, "schedule.grad_accum": 2, "tracking.register_model": "false"})], timeout=300)
    assert_same(encoder_weights(reference_run), encoder_weights(tmp_path / "single"), exact=False, atol=1e-5)


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(HIBERT + args, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    t0 = time.time()
    while not path.is_file():
        assert proc.poll() is None, f"run ended (exit {proc.returncode}) before {path} appeared"
        assert time.time() - t0 < timeout, f"{path} did not appear in {timeout}s"
        time.sleep(0.2)


def test_kill9_then_resume_is_bit_identical(tiny_data, tmp_path, reference_run):
    """Weights, and the logged training metrics: the window logged at step 6 spans the restart from the step-4
    checkpoint (steps 4-6), and its statistics for step 4 come from that checkpoint; the run ends off the
    log_every cadence, so steps 7-8 are logged at step 8."""
    args = ["pretrain", *tiny_train_overrides(tmp_path, "ref", tiny_data["open"], **REF_SCHEDULE),
            "--stage", "open-domain", "--nproc", "2"]
    proc = _start(args, tmp_path / "first.log")
    try:
        _wait_for(tmp_path / "ref" / "checkpoints" / "step_000000004" / "COMPLETE.json", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert not (tmp_path / "ref" / "export").exists()
    for later in (tmp_path / "ref" / "checkpoints").glob("step_*"):  # as if killed right after step 4's save
        if int(later.name.split("_")[1]) > 4:
            shutil.rmtree(later)
    out = run_hibert(args, timeout=300)
    assert "resumed from" in out.stderr and "at step 4 " in out.stderr, out.stderr[-2000:]
    assert_same(encoder_weights(reference_run), encoder_weights(tmp_path / "ref"))
    want = logged_by_step(reference_run.parent, "ref", "train_loss")
    assert sorted(want) == [3, 6, 8]
    got = [(m.step, m.value) for m in _history(tmp_path, "ref", "train_loss")]
    assert got == sorted(want.items()), got  # once per step: steps the killed run had logged are not logged again


def test_sigusr1_checkpoints_exits_for_requeue_and_resumes(tiny_data, tmp_path, reference_run):
    from hibert.runtime.dist_env import REQUEUE_EXIT_CODE

    args = ["pretrain", *tiny_train_overrides(tmp_path, "ref", tiny_data["open"], **{
        **REF_SCHEDULE, "checkpoint.every_steps": 100}), "--stage", "open-domain", "--nproc", "2"]
    proc = _start(args, tmp_path / "first.log")
    try:
        # preempt once the run is set up (its banner's last line: the flag is installed, the engine built), not
        # at a logged step: the tiny model takes 18 steps a second, so a signal sent at step 3 could land after the
        # last one (a preemption at the end, not mid-run)
        t0 = time.time()
        while "  checkpoints " not in (tmp_path / "first.log").read_text(errors="replace"):
            assert proc.poll() is None and time.time() - t0 < 240, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.02)
        proc.send_signal(signal.SIGUSR1)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "first.log").read_text(errors="replace")
    assert code == REQUEUE_EXIT_CODE, log[-3000:]
    assert "preempted by SIGUSR1" in log
    tags = sorted((tmp_path / "ref" / "checkpoints").glob("step_*/COMPLETE.json"))
    assert len(tags) == 1 and 1 <= int(tags[0].parent.name.split("_")[1]) < 8, tags
    run_hibert(args, timeout=300)
    assert_same(encoder_weights(reference_run), encoder_weights(tmp_path / "ref"))
    want = logged_by_step(reference_run.parent, "ref", "train_loss")
    got = [(m.step, m.value) for m in _history(tmp_path, "ref", "train_loss")]
    assert got == sorted(want.items()), got  # the window across the preemption's off-cadence step included


def test_corrupt_newest_checkpoint_is_skipped(tiny_data, tmp_path):
    over = tiny_train_overrides(tmp_path, "c", tiny_data["open"], **{"schedule.max_steps": 6,
                                                                      "tracking.register_model": "false"})
    run_hibert(["pretrain", *over, "--nproc", "2"], timeout=300)
    newest = tmp_path / "c" / "checkpoints" / "step_000000006"
    victim = sorted(newest.glob("*optim_states.pt"))[0]
    victim.write_bytes(victim.read_bytes()[:100])  # truncated, as by a full disk
    out = run_hibert(["pretrain", *over, "schedule.max_steps=8", "--nproc", "2"], timeout=300)
    assert "step_000000006 skipped" in out.stderr and "truncated" in out.stderr
    assert "resumed from" in out.stderr and "step_000000004" in out.stderr
    # the finished run given a longer schedule trains on, and its export carries the new end's evaluation
    run_hibert(["pretrain", *over, "schedule.max_steps=10", "--nproc", "2"], timeout=300)
    meta = json.loads((tmp_path / "c" / "export" / "export.json").read_text())
    valid = logged_by_step(tmp_path, "c", "valid_loss")
    assert meta["step"] == 10 and meta["final_metrics"]["valid_loss"] == valid[10], (meta["final_metrics"], valid)


def test_stage_two_starts_from_the_registered_stage_one_encoder(tiny_data, tmp_path):
    from hibert.registry import list_versions

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_hibert(["pretrain", *tiny_train_overrides(tmp_path, "open", tiny_data["open"], **{"schedule.max_steps": 4}),
                "--stage", "open-domain", "--nproc", "2"], timeout=300)
    # lr 0: the in-domain export must equal the open-domain encoder it was initialised from
    run_hibert(["pretrain", *tiny_train_overrides(tmp_path, "in", tiny_data["cnndm"], **{
        "schedule.max_steps": 2, "optimizer.lr": 0.0}), "--stage", "in-domain",
        "--init", "models:/hibert-encoder@open-domain", "--nproc", "2"], timeout=300)
    assert_same(encoder_weights(tmp_path / "open"), encoder_weights(tmp_path / "in"))
    rows = {tuple(r["aliases"]): r for r in list_versions(uri, "hibert-encoder")}
    assert ("open-domain",) in rows and ("in-domain",) in rows
    assert rows[("in-domain",)]["tags"]["stage"] == "in-domain"
    assert rows[("open-domain",)]["tags"]["world_size"] == "2"


def test_masks_identical_across_loader_worker_counts(tiny_data):
    from hibert.data_prep import DocumentDataset
    from hibert.config import load_config
    from hibert.runtime.loader import make_loader
    from hibert.pretrain.masked_sentence import MaskedSentenceTask

    cfg = load_config(None, ["model=hibert_tiny"])
    ds = DocumentDataset(tiny_data["open"], "train")
    task = MaskedSentenceTask(cfg, 600)
    batches = [np.arange(i, min(i + 5, len(ds))) for i in range(0, min(40, len(ds)), 5)]
    a = [it.batch for it in make_loader(task, ds, batches, epoch=3, workers=0)]
    b = [it.batch for it in make_loader(task, ds, batches, epoch=3, workers=2)]
    c = [it.batch for it in make_loader(task, ds, batches[3:], epoch=3, workers=1)]  # "resumed" at batch 3
    from test_modeling_packing import _assert_same_bundle

    for x, y in zip(a, b):  # every field, through the workers' one-buffer hand-over
        _assert_same_bundle(x, y)
    for x, y in zip(a[3:], c):
        assert torch.equal(x.docs.tokens, y.docs.tokens)


@pytest.mark.parametrize("stage", [2])   # ZeRO-3: DeepSpeed's universal load is not exact (checkpoint.py warns)
def test_resume_on_other_world_sizes_keeps_the_global_batch_and_the_dropout(tiny_data, tmp_path, stage):
    """2 ranks for 2 steps, then 1 rank to step 4, then 2 again to step 6 — nothing told of the global batch: it
    comes from the checkpoint (1 rank accumulates the 2 micro-batches that 2 ranks split), the position is exact,
    and dropout (on) is seeded per micro-batch of the plan, so the masks are the same on any world size. Against
    one uninterrupted 2-rank run the weights agree within 1e-5: not bit-identical because the gradient sums run in
    another order (one rank's accumulation against an all-reduce), ~1e-7 per step, which Adam carries; the key bias,
    whose true gradient is 0, is left out (assert_same)."""
    common = {"model.dropout": 0.1, "deepspeed.zero_stage": stage, "tracking.register_model": "false"}
    run_hibert(["pretrain", *tiny_train_overrides(tmp_path / "whole", "ref", tiny_data["open"], **common,
                                                  **{"schedule.max_steps": 6}), "--nproc", "2"], timeout=300)
    over = tiny_train_overrides(tmp_path, "ref", tiny_data["open"], **common)
    run_hibert(["pretrain", *over, "schedule.max_steps=2", "--nproc", "2"], timeout=300)
    out = run_hibert(["pretrain", *over, "schedule.max_steps=4"], timeout=300)
    assert "universal checkpoint for world size 1" in out.stderr and "resumed from" in out.stderr, out.stderr[-2000:]
    assert "global batch: 2 micro-batches (the checkpoint it resumes): 2 accumulated on each of 1 rank" in out.stderr
    out = run_hibert(["pretrain", *over, "schedule.max_steps=6", "--nproc", "2"], timeout=300)
    assert "at step 4 " in out.stderr and "universal checkpoint for world size 2" in out.stderr, out.stderr[-2000:]
    assert_same(encoder_weights(tmp_path / "whole" / "ref"), encoder_weights(tmp_path / "ref"), exact=False, atol=1e-5)


def _rank_pid(launcher: subprocess.Popen, rank: int, timeout: float = 60) -> int:
    """The pid of local rank `rank` started by the launcher (its child with RANK=<rank> in the environment)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                env = (proc / "environ").read_bytes().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if ppid == launcher.pid and f"RANK={rank}".encode() in env:
                return int(proc.name)
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} of launcher {launcher.pid} not found")


@pytest.mark.parametrize("fault", ["SIGSTOP", "SIGKILL"])
def test_a_hung_or_killed_rank_ends_the_job_in_bounded_time(tiny_data, tmp_path, fault):
    """SIGSTOP of one rank: the other's collective times out after run.collective_timeout_s and the job ends;
    kill -9 of one rank: the launcher names it and stops the others. Neither hangs."""
    args = ["pretrain", *tiny_train_overrides(tmp_path, "hung", tiny_data["open"], **{
        "schedule.max_steps": 400, "checkpoint.every_steps": 2, "run.collective_timeout_s": 8,
        "tracking.register_model": "false"}), "--stage", "open-domain", "--nproc", "2"]
    log = tmp_path / "run.log"
    proc = _start(args, log)
    try:
        _wait_for(tmp_path / "hung" / "checkpoints" / "step_000000002" / "COMPLETE.json", proc)
        os.kill(_rank_pid(proc, 1), getattr(signal, fault))
        t0 = time.time()
        code = proc.wait(timeout=120)
        elapsed = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    out = log.read_text()
    assert code != 0 and elapsed < 90, (code, elapsed)
    if fault == "SIGKILL":
        # the killed rank is named first, even when its peer's exit (it lost rank 1 in a collective) is seen
        # in the same poll of the launcher
        assert re.search(r"hibert: rank 1 \(pid \d+\) ended \(killed by SIGKILL\)", out), out[-3000:]
    else:   # rank 0 gives up on the stopped rank 1 in its collective
        assert "hibert: rank 0" in out and elapsed > 5
        assert "rank 0 lost its peers in a collective" in out and "Traceback" not in out, out[-3000:]


def test_a_full_disk_refuses_the_checkpoint_keeps_the_previous_and_resumes(tiny_data, tmp_path, reference_run,
                                                                           small_disk):
    """A checkpoint that cannot fit is refused on every rank before a byte is written (one line naming the
    space and the checkpoint kept); then an export that cannot fit leaves no partial export and the final
    checkpoint; once space is freed the run resumes, exports and ends as the uninterrupted one."""
    small_disk.resize("14m")  # two tags of this model (~5.5 MB each), not a third
    args = ["pretrain", *tiny_train_overrides(small_disk.path, "ref", tiny_data["open"], **{
        "schedule.max_steps": 8, "tracking.uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}),
            "--stage", "open-domain", "--nproc", "2"]
    out = run_hibert(args, timeout=300, check=False)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "no space for checkpoint step 6" in out.stderr and "step_000000004, is intact" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    ckpt = small_disk.path / "ref" / "checkpoints"
    assert sorted(p.parent.name for p in ckpt.glob("step_*/COMPLETE.json")) == ["step_000000002", "step_000000004"]
    assert not (ckpt / "step_000000006").exists()
    # room for the two remaining tags and ~0.4 MB more: training ends, the export (~1.4 MB) cannot fit
    tag = sum(f.stat().st_blocks * 512 for f in (ckpt / "step_000000004").rglob("*") if f.is_file())
    small_disk.resize(f"{(shutil.disk_usage(small_disk.path).used + 2 * tag + 400_000) // 1024}k")
    out = run_hibert(args, timeout=300, check=False)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.count("no space left on device for the export") == 2, out.stderr[-3000:]  # both ranks
    assert "final checkpoint (step 8) is complete" in out.stderr and "Traceback" not in out.stderr
    assert (ckpt / "step_000000008" / "COMPLETE.json").is_file()
    assert not (small_disk.path / "ref" / "export").exists()  # no half-written model where one is looked for
    assert not (small_disk.path / "ref" / "export.partial").exists()  # its space given back
    final_tag = {f.name: f.stat().st_mtime_ns for f in (ckpt / "step_000000008").rglob("*")}
    small_disk.resize("64m")
    out = run_hibert(args, timeout=300)
    assert "resumed from" in out.stderr
    # the rerun only publishes: the complete final tag is not evaluated or written again
    assert {f.name: f.stat().st_mtime_ns for f in (ckpt / "step_000000008").rglob("*")} == final_tag
    assert_same(encoder_weights(reference_run), encoder_weights(small_disk.path / "ref"))
    assert json.loads((small_disk.path / "ref" / "export" / "registry.json").read_text())["version"]


def test_an_export_that_fails_otherwise_stops_every_rank_at_once(tiny_data, tmp_path):
    """rank 0's export failing for another reason than space (here a file where export/ goes): rank 0 shows its
    error, the other rank learns it from rank 0 (one broadcast) and says so in one line, instead of waiting in
    a collective for run.collective_timeout_s."""
    (tmp_path / "blocked").mkdir()
    (tmp_path / "blocked" / "export").write_text("not a directory")
    args = ["pretrain", *tiny_train_overrides(tmp_path, "blocked", tiny_data["open"], **{
        "schedule.max_steps": 2, "run.collective_timeout_s": 600, "tracking.register_model": "false"}),
            "--stage", "open-domain", "--nproc", "2"]
    t0 = time.time()
    out = run_hibert(args, timeout=300, check=False)
    assert out.returncode != 0 and time.time() - t0 < 120, out.stderr[-3000:]
    assert "rank 1 lost its peers in a collective (rank 0 failed while exporting (NotADirectoryError" in out.stderr
    assert not (tmp_path / "blocked" / "export.partial").exists()


def test_a_second_run_on_the_same_directory_refuses_on_every_rank(tiny_data, tmp_path):
    """Two 2-rank runs with one run directory: the second's ranks learn from rank 0 (one broadcast) that the
    first holds it, and all exit with one line naming it, instead of interleaving checkpoints."""
    args = ["pretrain", *tiny_train_overrides(tmp_path, "busy", tiny_data["open"], **{
        "schedule.max_steps": 400, "checkpoint.every_steps": 2, "tracking.register_model": "false"}),
            "--stage", "open-domain", "--nproc", "2"]
    first = _start(args, tmp_path / "first.log")
    try:
        _wait_for(tmp_path / "busy" / "checkpoints" / "step_000000002" / "COMPLETE.json", first)
        second = run_hibert(args, timeout=120, check=False)
        assert first.poll() is None, "the first run must still be running"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    out = second.stdout + second.stderr
    assert second.returncode != 0 and out.count(f"run directory {tmp_path / 'busy'} is in use by pid") == 2, out[-3000:]
    assert "Traceback" not in out


@pytest.mark.timeout(300)
def test_a_missing_init_reference_is_one_line_before_any_rank_starts(tiny_data, tmp_path):
    """`run.init` naming an alias the store lacks, with --nproc 2: the launcher says so in one line within seconds
    and creates nothing (no run directory). Ranks started without the launcher (torchrun, srun) end in one line
    each: rank 0 sends the failure to its peers instead of leaving them to die in the broadcast."""
    from hibert.config import load_config, save_resolved

    over = tiny_train_overrides(tmp_path, "noinit", tiny_data["open"])
    t0 = time.time()
    out = run_hibert(["pretrain", *over, "run.init=models:/hibert-encoder@nope", "--nproc", "2"], timeout=120,
                     check=False)
    assert out.returncode == 1 and time.time() - t0 < 30, out.stderr[-3000:]
    assert out.stderr.count("\n") == 1 and "'models:/hibert-encoder@nope' does not resolve in sqlite" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"], out.stderr  # nothing created
    # the same config straight to the ranks
    cfg = load_config(None, [*over, "run.init=models:/hibert-encoder@nope"])
    recipe = save_resolved(cfg, tmp_path / "recipe")
    code = ("import sys; from hibert.runtime.launch import launch_local\n"
            "sys.exit(launch_local(2, ['-m', 'hibert.cli', 'pretrain', sys.argv[1]]))")
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", code, str(recipe)], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 1 and time.time() - t0 < 60, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and out.stderr.count("does not resolve") == 2, out.stderr[-3000:]


@pytest.mark.timeout(300)
def test_a_disk_filled_by_another_writer_mid_run_is_one_line_not_mlflow_tracebacks(tiny_data, small_disk):
    """The run directory and its sqlite store on a disk that another writer fills mid-run: MLflow's store logs each
    failed write with its traceback; those become one line per distinct error, and the run ends with its own."""
    small_disk.resize("40m")
    args = ["pretrain", *tiny_train_overrides(small_disk.path, "filled", tiny_data["open"], **{
        "schedule.max_steps": 3000, "schedule.epochs": 300, "checkpoint.every_steps": 2000,
        "tracking.register_model": "false"}), "--stage", "open-domain", "--nproc", "2"]
    log = small_disk.path.parent / "filled.log"
    proc = _start(args, log)
    try:
        t0 = time.time()
        while not re.search(r"step 3/", log.read_text()):
            assert proc.poll() is None and time.time() - t0 < 240, log.read_text()[-3000:]
            time.sleep(0.2)
        with open(small_disk.path / "filler", "wb") as f, pytest.raises(OSError):   # the other writer
            while True:
                f.write(b"\0" * 2**20)
                f.flush()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    out = log.read_text()
    assert code == 1 and "no space left on device" in out, out[-3000:]
    assert "Traceback" not in out and out.count("mlflow.store") <= 2, out[-5000:]


def _running(pid: int) -> bool:
    """Alive and not a zombie (a rank reparented to a PID 1 that does not reap stays one)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="Linux: PR_SET_PDEATHSIG and /proc")
@pytest.mark.timeout(300)
def test_the_ranks_die_with_a_killed_launcher(tiny_data, tmp_path):
    """kill -9 of the --nproc launcher: its ranks are gone within seconds (they do not train on and register)."""
    args = ["pretrain", *tiny_train_overrides(tmp_path, "orphans", tiny_data["open"], **{
        "schedule.max_steps": 3000, "schedule.epochs": 300, "checkpoint.every_steps": 2000}),
            "--stage", "open-domain", "--nproc", "2"]
    log = tmp_path / "orphans.log"
    proc = _start(args, log)
    try:
        ranks = [_rank_pid(proc, r) for r in (0, 1)]
        t0 = time.time()
        while not re.search(r"step 2/", log.read_text()):
            assert proc.poll() is None and time.time() - t0 < 240, log.read_text()[-3000:]
            time.sleep(0.2)
        proc.kill()
        proc.wait(timeout=30)
        t0 = time.time()
        while any(_running(pid) for pid in ranks) and time.time() - t0 < 10:
            time.sleep(0.1)
        assert not any(_running(pid) for pid in ranks), (ranks, log.read_text()[-2000:])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)   # the session: whatever the test left
        proc.wait(timeout=30)
    assert not (tmp_path / "orphans" / "export").exists()
