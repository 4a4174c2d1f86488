"""The runtime API: optimizer groups with their own lr and warmup, the operator's step lines, and the
refusal to publish a run that took no optimizer step, the refusal of an init export with another (or no)
tokenizer."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from hibert.runtime.publish import NothingTrained, publish
from hibert.runtime.step_log import StepLog, banner, metric_line


def test_step_line_starts_with_progress_then_loss_and_has_eta():
    log = StepLog(total_steps=200, start_step=100, enabled=False)
    log.t0 -= 10.0  # 10 s for the 20 steps this process ran
    line = log.line(120, {"lr": 1e-4, "tokens_per_s": 12345.6, "mfu": 0.4512, "train_ppl": 20.1,
                          "train_loss": 3.0, "data_wait_fraction": 0.012, "grad_norm": 1.5})
    assert line.startswith("step 120/200 train_loss=3 train_ppl=20.1 | tokens/s=12,346 mfu=45.1% data_wait=1.2%")
    assert "lr=0.0001" in line and line.endswith("| eta 0m40s")  # 80 steps left at 0.5 s/step



def _planner(costs, epochs: int, max_steps: int | None = None, epoch: int = 0, step_in_epoch: int = 0,
             global_step: int = 0):
    """The run planner on a schedule, the documents' costs, 2 ranks and a position."""
    from hibert.config.training import ScheduleConfig
    from hibert.runtime.run_plan import RunPlanner
    from hibert.runtime.train_state import TrainState

    schedule = ScheduleConfig(seed=3, batch_tokens=1000, max_docs_per_batch=64, grad_accum=1, epochs=epochs,
                              max_steps=max_steps)
    t = RunPlanner(schedule, costs, 2, TrainState(epoch=epoch, step_in_epoch=step_in_epoch, global_step=global_step))
    t.total = lambda: t.total_steps(t.plan(t.state.epoch))
    return t


def test_planned_total_counts_each_epochs_own_plan_fresh_and_resumed(monkeypatch):
    import numpy as np

    import hibert.runtime.run_plan as trainer

    costs = np.random.default_rng(0).integers(20, 300, 1000)
    steps = [_planner(costs, 5).plan(e).steps for e in range(5)]
    assert len(set(steps)) > 1  # the epochs' shuffles pack into different numbers of batches
    assert _planner(costs, 5).total() == (sum(steps), True)
    # resumed in epoch 3 at its 4th step: the same total (the old count was epoch 3's length x 5)
    resumed = _planner(costs, 5, epoch=3, step_in_epoch=4, global_step=sum(steps[:3]) + 4)
    assert resumed.total() == (sum(steps), True)
    assert _planner(costs, 5, max_steps=steps[0] + 2).total() == (steps[0] + 2, True)
    assert _planner(costs, 5, max_steps=10 * sum(steps)).total() == (sum(steps), True)
    monkeypatch.setattr(trainer, "_EXACT_PLAN_DOCS", 100)  # too many documents to plan every epoch ahead
    assert _planner(costs, 5).total() == (5 * steps[0], False)
    assert _planner(costs, 1).total() == (steps[0], True)  # nothing later to plan

def test_metric_line_and_banner_are_plain_text():
    assert metric_line({"valid_rouge": 0.31, "valid_loss": 2.0}) == "valid_loss=2 valid_rouge=0.31"
    text = banner({"world size": 8, "ZeRO stage": 2})
    assert "world size  8" in text and "ZeRO stage  2" in text


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_host_peak_memory_is_the_process_own_not_the_launcher_that_forked_it():
    # a launcher that holds 1 GB starts a rank: ru_maxrss survives fork + exec, so the rank would report >= 1 GB
    launcher = textwrap.dedent("""
        import subprocess, sys
        held = b"x" * (1 << 30)   # resident: written, not calloc'd
        rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
        rank = subprocess.run([sys.executable, "-c", "import torch; from hibert.runtime.metrics import "
                               "peak_memory_gb; print(peak_memory_gb(torch.device('cpu')) * 2**20)"],
                              capture_output=True, text=True, check=True)
        print(rss, float(rank.stdout.split()[-1]))
    """)
    out = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    launcher_kib, rank_kib = map(float, out.stdout.split())
    assert launcher_kib > 1 << 20
    assert 0 < rank_kib < launcher_kib - (600 << 10)   # torch alone: ~250 MB


def test_window_reports_collate_time_and_the_step_breakdown_per_step():
    import torch

    from hibert.runtime.metrics import PhaseClock, Window

    w = Window(peak_tflops=None, world_size=2)
    for collate in (0.004, 0.006):
        w.add(tokens=100, flops=0.0, wait_s=0.0, collate_s=collate)
    w.add_phase("forward", 0.3)
    w.add_phase("forward", 0.1)
    w.steps = 2
    m = w.flush()
    assert m["collate_ms"] == pytest.approx(5.0) and m["forward_ms"] == pytest.approx(200.0)
    assert "mfu" not in m and w.phases == {} and w.micro == 0  # flushed
    off = PhaseClock(w, torch.device("cpu"), on=False)
    off.start()
    off.lap("forward")
    assert w.phases == {}  # off by default: nothing timed, nothing logged
    line = metric_line({"tokens_per_s": 10.0, "forward_ms": 12.5, "grad_norm": 1.0})
    assert line == "tokens/s=10 forward_ms=12.5 | grad_norm=1"


def test_a_run_without_optimizer_steps_is_never_published():
    cfg = SimpleNamespace(schedule=SimpleNamespace(epochs=3))
    with pytest.raises(NothingTrained, match="no optimizer step was taken"):
        publish(cfg, None, 0, {}, selection=None, tracker=None, rt=None, train_data=[])


def test_the_train_state_round_trips_through_a_checkpoint_and_reads_older_ones():
    """The run state a checkpoint's marker keeps is JSON under the key names every version wrote: it comes back
    field for field; an older checkpoint's (no evaluation fields yet, a key since dropped) resumes with the
    defaults for what it lacks, and this process keeps its own config hash, world size and micro-batches a step."""
    import json

    from hibert.runtime.train_state import TrainState

    state = TrainState(seed=3, config_hash="abc", world_size=2, micro_per_step=4, global_step=12, epoch=1,
                       step_in_epoch=5, mlflow_run_id="r1", best=0.5, evals_without_improvement=1,
                       candidates=[[0.5, 10, "/run/best/step_000000010.safetensors", {"valid_rouge": 0.5}]],
                       last_eval_step=10, last_eval={"valid_rouge": 0.5},
                       train_window=[{"loss_sum": [1.5, "float64"]}, {"loss_sum": [2.0, "float64"]}],
                       early_stopped=True, finished=True, final_metrics={"valid_rouge": 0.5})
    saved = json.loads(json.dumps(state.to_dict()))
    assert TrainState.from_dict(saved) == state
    assert saved.items() >= {"global_step": 12, "epoch": 1, "step_in_epoch": 5, "best": 0.5, "candidates":
                             state.candidates, "evals_without_improvement": 1, "mlflow_run_id": "r1", "seed": 3,
                             "config_hash": "abc", "world_size": 2, "micro_per_step": 4}.items()
    old = {"global_step": 7, "epoch": 0, "step_in_epoch": 7, "best": None, "evals_without_improvement": 0,
           "mlflow_run_id": "r0", "candidates": [[1.0, 5, "/x.safetensors"]], "seed": 3, "config_hash": "old",
           "world_size": 4, "dropped_key": 1}
    now = TrainState(seed=3, config_hash="new", world_size=2, micro_per_step=2)
    now.restore(old)
    assert now == TrainState(seed=3, config_hash="new", world_size=2, micro_per_step=2, global_step=7,
                             step_in_epoch=7, mlflow_run_id="r0", candidates=[[1.0, 5, "/x.safetensors"]])


CHILD = textwrap.dedent("""
    import torch
    from hibert.config import load_config
    from hibert.runtime.engine import build_engine, init_distributed
    from hibert.runtime.schedule import lr_multiplier
    from hibert.runtime.task import ParamGroup

    cfg = load_config(None, ["optimizer.lr=0.01", "schedule.warmup_steps=4", "deepspeed.zero_stage=1"])
    rt = init_distributed(cfg)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    groups = [ParamGroup("encoder", list(model[0].parameters()), 0.0, lr_scale=0.1, warmup_steps=2),
              ParamGroup("decoder", list(model[1].parameters()), 0.0)]
    engine = build_engine(cfg, model, rt, groups)
    from hibert.runtime import host_syncs
    assert engine.optimizer.unscale_and_clip_grads.__func__ is host_syncs.unscale_and_clip_grads
    for step in range(5):
        want = [0.01 * 0.1 * lr_multiplier(step, 2, "inverse_sqrt", None),
                0.01 * lr_multiplier(step, 4, "inverse_sqrt", None)]
        got = engine.get_lr()
        assert all(abs(a - b) < 1e-12 for a, b in zip(got, want)), (step, got, want)
        engine.backward(model(torch.randn(3, 4)).sum())
        engine.step()
    print("ok")
""")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_param_groups_have_their_own_lr_and_warmup_in_deepspeed(tmp_path):
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=tmp_path, capture_output=True, text=True, timeout=110)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_an_init_export_with_another_tokenizer_or_none_is_refused(tmp_path):
    """run.init's tokenizer.model must be the dataset's (byte for byte); an export without one is damaged
    (every export carries it) and is refused too, rather than trained on ids nothing can vouch for."""
    import json
    import shutil

    from hibert.data_prep import tokenizer as tok
    from hibert.config import load_config
    from hibert.config.data import TokenizerConfig
    from hibert.runtime.run import InitModel, check_init_compatible

    repo = Path(__file__).resolve().parents[1]
    lines = (repo / "samples" / "reuters_sample.jsonl").read_text().splitlines()[:40]
    sentences = [s for line in lines for s in json.loads(line)["body"].split("\n") if s.strip()]
    cfg_tok = dict(model_type="bpe", hard_vocab_limit=False)
    ours = tok.train(sentences, TokenizerConfig(vocab_size=200, **cfg_tok), tmp_path / "dataset")
    other = tok.train(sentences, TokenizerConfig(vocab_size=120, **cfg_tok), tmp_path / "other")
    export = tmp_path / "export"
    export.mkdir()
    cfg = load_config(None, ["model=hibert_tiny", f"data.dataset={tmp_path / 'dataset'}", f"run.init={export}"])
    init = InitModel({}, cfg.model.model_copy(), {}, export)

    shutil.copy(ours, export / "tokenizer.model")
    check_init_compatible(cfg, init, ours)           # the dataset's own tokenizer: accepted
    shutil.copy(other, export / "tokenizer.model")   # another vocabulary: the encoder's ids mean other pieces
    with pytest.raises(ValueError, match=r"was trained with another tokenizer than the dataset .*dataset; prepare "
                                         r"the data with data.tokenizer.model=.*export/tokenizer.model"):
        check_init_compatible(cfg, init, ours)
    (export / "tokenizer.model").unlink()
    with pytest.raises(ValueError, match=r"run.init=.*export: the export has no tokenizer.model .* incomplete"):
        check_init_compatible(cfg, init, ours)


def test_one_writer_per_run_directory_and_stale_locks_free_themselves(tmp_path):
    """A second claim on a run directory names the live holder (pid, host) and refuses; when the holder dies
    (kill -9: no cleanup code runs) the kernel drops its flock and the next claim succeeds."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from hibert.errors import UserError
    from hibert.runtime.writer_lock import claim_run_dir

    run = tmp_path / "run"
    code = (f"from pathlib import Path\nfrom hibert.runtime.writer_lock import claim_run_dir\n"
            f"lock = claim_run_dir(Path({str(run)!r}), True)\nprint('held', flush=True)\nimport time\ntime.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"run directory .* is in use by pid {holder.pid} on "):
            claim_run_dir(run, True)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        deadline = time.time() + 10
        while True:   # the kernel releases the flock as the process goes
            try:
                lock = claim_run_dir(run, True)
                break
            except UserError:
                assert time.time() < deadline
                time.sleep(0.1)
        assert lock is not None and lock.is_locked
        assert f'"pid": {os.getpid()}' in (run / ".writer.json").read_text()
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc")
def test_keep_freed_memory_reuses_large_blocks_without_new_page_faults():
    """A freed 64 MB tensor's memory serves the next 60 MB one (not an equal size: torch's 64-byte-aligned
    blocks need a little more than the freed one): with glibc's defaults the second is mapped afresh (one minor
    page fault per 4 KB page, ~15,000), once freed memory is kept it costs none. Each setting in a fresh process
    (a malloc setting is process-wide)."""
    code = textwrap.dedent("""
        import resource, sys, torch
        from hibert.runtime.allocator import keep_freed_memory
        if sys.argv[1] == "keep":
            assert keep_freed_memory() and keep_freed_memory()  # applied, and idempotent
        torch.empty(16 << 20).fill_(1.0)                         # 64 MB, freed at once
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(15 << 20).fill_(2.0)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """)
    faults = {mode: int(subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                                       check=True, timeout=120).stdout.split()[-1]) for mode in ("default", "keep")}
    assert faults["default"] > 10_000 and faults["keep"] < 1_000, faults


def test_prune_sets_aside_tags_past_the_one_written_and_restate_never_removes_a_tag(tmp_path):
    """keep_last 1, a good tag at 2000 and a corrupt one at 2500 (a resume skipped it), then 2200 written: 2200
    stays (the corrupt 2500 used to outrank it and have it deleted) and 2500 is set aside. Marking the run finished
    in 2200 rewrites its marker in place instead of deleting and rewriting the only checkpoint."""
    from hibert.runtime.checkpoint import SUPERSEDED, CheckpointManager, read_marker, tag_for, verify, write_marker

    def tag(step: int, corrupt: bool = False) -> Path:
        d = tmp_path / tag_for(step)
        d.mkdir()
        (d / "w.bin").write_bytes(bytes([step % 251]) * 100)
        write_marker(d, step=step, world_size=1, state={"global_step": step})
        if corrupt:
            (d / "w.bin").write_bytes(b"x" * 100)
        return d

    tag(2000), tag(2500, corrupt=True)
    current = tag(2200)
    mgr = CheckpointManager(tmp_path, keep_last=1, rank=0, world_size=1)
    mgr._prune(current)
    assert sorted(p.name for p in tmp_path.iterdir()) == [tag_for(2200), SUPERSEDED + tag_for(2500)]
    assert mgr.restate(2200, {"global_step": 2200, "finished": True})
    assert read_marker(current)["state"]["finished"] and verify(current)[0]
    assert not mgr.restate(2300, {}) and not CheckpointManager(tmp_path, 1, 0, world_size=2).restate(2200, {})


def test_a_preemption_signal_before_the_trainer_exists_is_kept_not_fatal():
    """prepare_run installs the process's one flag first: SIGUSR1 during the start-up (imports, DeepSpeed, data)
    used to kill the rank, costing a restart; now the trainer, built later, sees it at its first step boundary."""
    code = textwrap.dedent("""
        import os, signal
        from hibert.runtime.preemption import preemption_flag
        flag = preemption_flag()
        os.kill(os.getpid(), signal.SIGUSR1)           # still starting up: no trainer yet
        assert preemption_flag() is flag and flag.signal_name == "SIGUSR1"
        print("alive")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "alive", out.stderr[-2000:]


def test_a_checkpoint_reaches_the_disk_before_its_marker_names_it(tmp_path, monkeypatch):
    """Every file of a tag is fsynced before the marker is written (each rank flushes what its machine wrote,
    before the barrier); the marker's own bytes are fsynced before the rename that publishes it, and the
    directory after it. A real one-rank gloo group and a stand-in engine that writes two shards."""
    import os

    import torch.distributed as dist

    from hibert.runtime import checkpoint as ck

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, Path.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(self, target):
        events.append(("rename", Path(target).name))
        return real_replace(self, target)

    class Engine:
        def save_checkpoint(self, root, tag, save_latest, client_state):
            for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
                (Path(root) / tag / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(root) / tag / name).write_bytes(os.urandom(4096))

        def module(self):
            return None

    monkeypatch.setattr(ck.os, "fsync", fsync)
    monkeypatch.setattr(Path, "replace", replace)
    monkeypatch.setattr(ck.CheckpointManager, "_check_space", lambda self, engine, step: None)
    # a file store: no port, and nothing left in this process's environment for the runs other tests start
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'pg'}")
    try:
        tag = ck.CheckpointManager(tmp_path, keep_last=2, rank=0, world_size=1).save(Engine(), 7, {"global_step": 7})
    finally:
        dist.destroy_process_group()
    assert ck.verify(tag)[0]
    rename = events.index(("rename", ck.MARKER))
    synced_before = {Path(p).name for kind, p in events[:rename] if kind == "fsync"}
    files = {p.name for p in tag.iterdir() if p.name != ck.MARKER}
    assert files <= synced_before, files - synced_before                   # every shard and the RNG state
    assert (ck.MARKER + ".tmp") in synced_before                            # the marker's bytes, then the rename
    assert ("fsync", str(tag)) in events[rename + 1:]                       # then the directory entry


def test_a_window_without_trained_steps_logs_its_statistics_without_rates():
    """A resume with nothing left to train logs the window its checkpoint kept: the training statistics, not the
    throughput, memory or gradient norm of a process that did not train (they would read as a drop)."""
    import torch

    from hibert.runtime.metrics import Window
    from hibert.runtime.trainer import Trainer

    logged = []
    fake = SimpleNamespace(
        rt=SimpleNamespace(device=torch.device("cpu")), lr_names=["all"],
        task=SimpleNamespace(summarize=lambda totals, prefix: {f"{prefix}loss": totals["loss_sum"] / totals["n"]}),
        engine=SimpleNamespace(get_lr=lambda: [0.1], get_global_grad_norm=lambda: 2.0),
        tracker=SimpleNamespace(metrics=lambda m, step: logged.append((step, m))),
        step_log=SimpleNamespace(step=lambda step, m: None))
    Trainer._log_window(fake, 8, Window(None, 1), {"loss_sum": 6.0, "n": 3.0}, 0, summed=True)
    assert logged == [(8, {"train_loss": 2.0, "lr": 0.1, "epoch": 0})]
    trained = Window(None, 1)
    trained.add(1000, 0.0, 0.0)
    trained.steps += 1
    Trainer._log_window(fake, 9, trained, {"loss_sum": 1.0, "n": 1.0}, 0, summed=True)
    step, m = logged[-1]
    assert step == 9 and m["grad_norm"] == 2.0 and m["tokens_per_s"] > 0 and "peak_memory_gb" in m


def test_the_launcher_looks_up_run_init_without_downloading_or_creating_anything(tmp_path):
    """`check_init_reference` (the launcher's check of run.init): a registered alias or version and a directory
    pass; a missing alias, version or model, a malformed reference, a missing directory and a store that does
    not exist are one UserError line each, and looking creates no store."""
    from conftest import seed_store

    from hibert.errors import UserError
    from hibert.registry import client
    from hibert.runtime.launch import check_init_reference

    seed_store(tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = client(uri)
    c.create_registered_model("enc")
    version = c.create_model_version("enc", source=str(tmp_path)).version
    c.set_registered_model_alias("enc", "stage", version)
    for ok in ("models:/enc@stage", f"models:/enc/{version}", str(tmp_path), None):
        check_init_reference(ok, uri)
    for bad, needle in [("models:/enc@nope", "does not resolve"), ("models:/enc/99", "does not resolve"),
                        ("models:/other@stage", "does not resolve"), ("models:/enc/x", "<version number>"),
                        (str(tmp_path / "none"), "neither a models:/ reference nor a directory")]:
        with pytest.raises(UserError, match=needle):
            check_init_reference(bad, uri)
    with pytest.raises(UserError, match="no registry at"):
        check_init_reference("models:/enc@stage", f"sqlite:///{tmp_path / 'elsewhere' / 'mlflow.db'}")
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("loss_scale", [1.0, 65536.0])
@pytest.mark.parametrize("clip_grad", [0.0, 1.0])
def test_sync_free_clipping_scales_gradients_as_deepspeed_does(clip_grad, loss_scale):
    """ZeRO-1/2's clipping without its host sync: the same gradients, bit for bit, for norms under and over
    the clip, DeepSpeed's -1 sentinel, NaN and inf, flat and partitioned gradient groups."""
    import torch
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    from hibert.runtime.host_syncs import unscale_and_clip_grads

    def groups():
        g = torch.Generator().manual_seed(0)
        return [torch.randn(7, generator=g) * 3, [torch.randn(3, generator=g), torch.full((2,), float("nan"))]]

    opt = SimpleNamespace(clip_grad=clip_grad, loss_scale=loss_scale, device=torch.device("cpu"))
    for norm in (0.25, 3.0, 2e5, -1.0, float("nan"), float("inf")):
        ours, theirs = groups(), groups()
        unscale_and_clip_grads(opt, ours, torch.tensor(norm))
        DeepSpeedZeroOptimizer.unscale_and_clip_grads(opt, theirs, torch.tensor(norm))
        for a, b in zip([ours[0], *ours[1]], [theirs[0], *theirs[1]]):
            assert torch.equal(a, b) or torch.allclose(a, b, rtol=0, atol=0, equal_nan=True), (norm, a, b)


def test_a_single_process_asks_no_collective_for_the_preemption_flag():
    """Asked at every step: with one process it reads the flag and nothing else (no tensor, no device)."""
    from hibert.runtime.preemption import PreemptionFlag

    flag = PreemptionFlag()
    assert flag.agreed() is False
    flag.signal_name = "SIGUSR1"
    assert flag.agreed() is True


def test_a_single_process_agrees_on_a_checkpoint_without_a_collective():
    """The resume's "loaded on every rank" check: with one process no tensor is reduced (over NCCL a host tensor
    would raise), so it holds outside any process group."""
    from hibert.runtime.checkpoint import all_ranks_ok

    assert all_ranks_ok(1) is True and all_ranks_ok(0) is False


def test_a_reduction_over_nccl_takes_the_current_gpu_and_over_gloo_the_host(monkeypatch):
    """NCCL refuses host tensors; gloo (the CPU default, the host group beside NCCL) takes them. The backend is
    the group's: a host group passed beside an NCCL default stays on the host."""
    import torch

    from hibert.runtime import collectives

    backends = {None: "nccl", "host": "gloo"}
    monkeypatch.setattr(collectives.dist, "get_backend", lambda group=None: backends[group])
    monkeypatch.setattr(collectives.torch.cuda, "current_device", lambda: 3)
    assert collectives.reduce_device() == torch.device("cuda", 3)
    assert collectives.reduce_device("host") is None


def test_a_lone_process_exports_the_free_port_it_was_given(monkeypatch):
    """Two single-process runs on one node each get their own port, and the exported MASTER_PORT is that port
    (not the default 29500 it was detected with)."""
    from hibert.runtime import dist_env, engine

    launcher = ("SLURM_", "MASTER_", "OMPI_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    # a copy of the environment without a launcher's variables, put back after the test (it exports RANK ...)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith(launcher)})
    monkeypatch.setattr(engine, "free_port", lambda: 41234)
    env = engine.process_env()
    assert env.master_port == 41234 and env.world_size == 1
    assert os.environ["MASTER_PORT"] == "41234" != str(dist_env.DEFAULT_MASTER_PORT)


def test_compiled_layers_give_the_eager_loss_and_gradients():
    """deepspeed.torch_compile: every Transformer layer compiled in place (parameter names unchanged), the
    pretraining loss and gradients as eager. The graph capture is what is checked here (aot_eager: dynamo and
    AOTAutograd without code generation); the GPU suite compiles with inductor (tests/test_runtime_cuda.py)."""
    import torch

    from hibert.config.model import ModelConfig
    from hibert.modeling import HibertForPretraining, make_pretrain_batch
    from hibert.runtime.compile import compile_layers
    from hibert.tokens import MASK_ID

    cfg = ModelConfig(name="t", vocab_size=40, hidden=16, layers=1, heads=2, dropout=0.0, max_positions=32)
    words = [[[6, 7, 8, 9], [10, 11, 12], [13, 14]], [[15, 16, 17, 18, 19], [20, 21]]]
    masked = [[[MASK_ID] * 4, *d[1:]] if i == 0 else [d[0], [MASK_ID] * 2] for i, d in enumerate(words)]
    batch = make_pretrain_batch(masked, [[0], [1]], [[words[0][0]], [words[1][1]]])
    torch.manual_seed(0)
    eager = HibertForPretraining(cfg).train()
    compiled = HibertForPretraining(cfg).train()
    compiled.load_state_dict(eager.state_dict())
    assert compile_layers(compiled, backend="aot_eager") == 3   # sentence, document, decoder: one layer each
    assert list(compiled.state_dict()) == list(eager.state_dict())
    want, got = (m(batch).loss for m in (eager, compiled))
    torch.autograd.backward([want, got])
    torch.testing.assert_close(got, want)
    grads = {name: p.grad for name, p in eager.named_parameters()}
    for name, p in compiled.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], msg=name)


def test_the_bf16_overflow_check_is_a_switch():
    """deepspeed.check_finite_grads=false: no per-step overflow check (DeepSpeed's bf16.check_grad_overflow);
    the default leaves DeepSpeed's JSON as it was."""
    from hibert.config import load_config
    from hibert.runtime.engine import deepspeed_config

    on = deepspeed_config(load_config(None, []), "bf16")
    off = deepspeed_config(load_config(None, ["deepspeed.check_finite_grads=false"]), "bf16")
    assert on["bf16"] == {"enabled": True} and off["bf16"] == {"enabled": True, "check_grad_overflow": False}
    assert deepspeed_config(load_config(None, ["deepspeed.check_finite_grads=false"]), "fp32")["bf16"] == {
        "enabled": False}


def test_a_killed_launchers_config_folder_goes_and_a_live_ones_stays(tmp_path):
    """A launcher killed before its finally leaves launch-<pid>-*/config.resolved.yaml (0600, credentials): the
    next launch into the run directory removes those of dead processes and of the old unnamed form."""
    import subprocess

    from hibert.runtime.launch import remove_stale_launch_dirs

    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in (f"launch-{dead.pid}-abc", "launch-xyz123", f"launch-{os.getpid()}-live"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.resolved.yaml").write_text("tracking: {token: s3cret}\n")
    removed = {p.name for p in remove_stale_launch_dirs(tmp_path)}
    assert removed == {f"launch-{dead.pid}-abc", "launch-xyz123"}
    assert [p.name for p in tmp_path.glob("launch-*")] == [f"launch-{os.getpid()}-live"]


SYNC_CHILD = textwrap.dedent("""
    import torch
    from hibert.config import load_config
    from hibert.runtime.engine import build_engine, init_distributed

    cfg = load_config(None, ["deepspeed.zero_stage=ZERO", "schedule.warmup_steps=2"])
    rt = init_distributed(cfg)
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    calls = {"sync": 0, "item": 0}
    real_sync, real_item = acc.synchronize, torch.Tensor.item
    def sync(*a, **k):
        calls["sync"] += 1
        return real_sync(*a, **k)
    def item(self):
        # torch's AdamW keeps its step counters on the host unless fused or capturable (as on CUDA): not a device read
        if id(self) not in host_steps:
            calls["item"] += 1
        return real_item(self)
    acc.synchronize = sync
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    engine = build_engine(cfg, model, rt)
    x = torch.randn(4, 8)
    per_step, host_steps = [], set()
    for step in range(6):
        opt = getattr(engine.optimizer, "optimizer", engine.optimizer)
        host_steps = {id(st["step"]) for st in opt.state.values() if torch.is_tensor(st.get("step"))}
        before = dict(calls)
        torch.Tensor.item = item
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        torch.Tensor.item = real_item
        per_step.append((calls["sync"] - before["sync"], calls["item"] - before["item"]))
    print("steps", per_step[2:])
""")


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("zero", [1, 2])
def test_a_steady_state_step_through_the_deepspeed_engine_never_syncs_the_device(tmp_path, zero):
    """DeepSpeed's throughput timer synchronized the device at the start of every forward and the end of every
    step, and ZeRO-1/2's overlap_comm at the end of every backward even on one rank: counted through the real
    engine (its accelerator's synchronize and Tensor.item; the optimizer's host-side step counters aside), a
    steady-state step has none."""
    out = subprocess.run([sys.executable, "-c", SYNC_CHILD.replace("ZERO", str(zero))], cwd=tmp_path,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = eval(out.stdout.strip().splitlines()[-1].removeprefix("steps "))
    assert steps == [(0, 0)] * 4, steps


def test_the_global_batch_is_the_setting_the_checkpoint_or_the_first_start_and_accumulation_follows(tmp_path):
    """schedule.global_batch (M micro-batches a step) wins; else the resumed checkpoint's M; else ranks x grad_accum.
    Each rank accumulates M / ranks; a world size that does not divide M is one line naming those that do."""
    from hibert.config import Config
    from hibert.errors import UserError
    from hibert.runtime.checkpoint import tag_for, write_marker
    from hibert.runtime.global_batch import micro_batch_seed, resolve_global_batch, saved_global_batch

    cfg = Config()
    cfg.schedule.grad_accum = 2
    got, source = resolve_global_batch(cfg, 2, None)
    assert (got.schedule.global_batch, got.schedule.grad_accum) == (4, 2) and "grad_accum=2" in source
    got, source = resolve_global_batch(cfg, 1, 4)                 # a requeue on half the ranks: the checkpoint's 4
    assert (got.schedule.global_batch, got.schedule.grad_accum, source) == (4, 4, "the checkpoint it resumes")
    cfg.schedule.global_batch = 6
    assert resolve_global_batch(cfg, 3, 4)[0].schedule.grad_accum == 2   # the setting over the checkpoint
    with pytest.raises(UserError, match=r"6 micro-batches \(schedule.global_batch\) cannot be split over 4 ranks: "
                                        r"run on 1, 2, 3, 6 ranks"):
        resolve_global_batch(cfg, 4, None)
    assert cfg.schedule.grad_accum == 2                            # the given config is not changed
    # the checkpoint's: the newest complete tag's marker, or the one checkpoint.resume names; none when "never"
    cfg = Config()
    cfg.run.output_dir, cfg.run.name = str(tmp_path), "r"
    assert saved_global_batch(cfg, True) is None
    for step, micro in ((2, 4), (4, 8)):
        tag = cfg.checkpoint_dir / tag_for(step)
        tag.mkdir(parents=True)
        write_marker(tag, step=step, world_size=2, state={"micro_per_step": micro})
    assert saved_global_batch(cfg, True) == 8
    cfg.checkpoint.resume = tag_for(2)
    assert saved_global_batch(cfg, True) == 4
    cfg.checkpoint.resume = "never"
    assert saved_global_batch(cfg, True) is None
    # one dropout seed per micro-batch of the plan: distinct across indices, epochs and runs, within 63 bits
    seeds = {micro_batch_seed(r, e, k) for r in (1, 2) for e in range(3) for k in range(1000)}
    assert len(seeds) == 6000 and max(seeds) < 2**63 and micro_batch_seed(1, 0, 5) == micro_batch_seed(1, 0, 5)


Z3_UNIVERSAL_CHILD = textwrap.dedent("""
    import torch
    from pathlib import Path
    from hibert.config import load_config
    from hibert.runtime.engine import build_engine, init_distributed
    from hibert.runtime.checkpoint import CheckpointManager, Resumable

    cfg = load_config(None, ["deepspeed.zero_stage=3", "schedule.warmup_steps=2", "optimizer.weight_decay=0.01"])
    rt = init_distributed(cfg)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    engine = build_engine(cfg, model, rt)     # two param groups: decay (weights), no_decay (biases)
    x = torch.randn(4, 8)
    for _ in range(2):
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    lr = getattr(engine.optimizer, "optimizer", engine.optimizer).param_groups[0]["lr"]
    manager = CheckpointManager(Path("ckpt"), 2, 0, 1)
    path = manager.save(engine, 2, {"world_size": 1})
    manager._load_universal(engine, Resumable(path.name, path, {"world_size": 2}))   # as if 2 ranks wrote it
    groups = getattr(engine.optimizer, "optimizer", engine.optimizer).param_groups
    print("groups", [(g["name"], g["weight_decay"], g["lr"] == lr) for g in groups])
""")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_zero3_universal_load_keeps_each_param_groups_own_hyperparameters(tmp_path):
    """DeepSpeed's ZeRO-3 universal load gives every param group group 0's hyperparameters (the no-decay group would
    be decayed on another world size): each group keeps its own, and the lr the scheduler last set."""
    out = subprocess.run([sys.executable, "-c", Z3_UNIVERSAL_CHILD], cwd=tmp_path, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    groups = eval(out.stdout.strip().splitlines()[-1].removeprefix("groups "))
    assert groups == [("decay", 0.01, True), ("no_decay", 0.0, True)], groups
    assert "ZeRO-3 on another world size" in out.stderr
