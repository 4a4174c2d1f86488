"""A tracking server that goes away mid-run: training goes on, nothing logged is lost, the registration waits.

The integration test kills a real `mlflow server` (its whole process group, SIGKILL) while a pretraining run
logs to it, lets the run end with the server still gone (exit TRACKING_PENDING_EXIT_CODE, export written,
registration pending), starts the server again on the same store and reruns the job, as a requeue would: the
outbox is sent, every step's metrics are on the server and the export is registered once.
"""
import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import HIBERT, run_hibert, tiny_train_overrides
from hibert.runtime.outbox import Outbox, batches, drain
from serving_helpers import free_port, kill_group, tracking_server


# ------------------------------------------------------------------ the outbox on its own

def test_outbox_keeps_order_and_drops_only_a_line_cut_by_a_crash(tmp_path):
    box = Outbox(tmp_path)
    for step in (1, 2):
        box.append({"op": "metrics", "run_id": "r", "values": {"loss": 1.0 / step}, "step": step, "timestamp": step})
    box.append({"op": "end", "run_id": "r", "status": "FINISHED"})
    with box.path.open("a") as f:
        f.write('{"op": "metr')  # kill -9 in the middle of a write
    assert [o["op"] for o in box.read()] == ["metrics", "metrics", "end"]
    box.path.write_text('{"op": "end"}\nnot json\n{"op": "end"}\n')
    with pytest.raises(ValueError, match="line 2"):
        box.read()


def test_batches_merge_consecutive_metrics_of_one_run_only():
    m = lambda run, n: {"op": "metrics", "run_id": run, "values": {f"k{i}": 0.0 for i in range(n)}}  # noqa: E731
    ops = [m("a", 2), m("a", 3), {"op": "artifacts", "run_id": "a"}, m("a", 1), m("b", 1), m("b", 999), m("b", 2)]
    assert batches(ops) == [(0, 2), (2, 3), (3, 4), (4, 6), (6, 7)]  # 1 + 999 = 1000 fit, + 2 would not


def test_drain_stops_while_unreachable_and_rejects_what_a_live_server_refuses(tmp_path):
    box = Outbox(tmp_path)
    for i in range(4):
        box.append({"op": "end", "run_id": str(i), "status": "FINISHED"})
    sent: list[str] = []

    def send(ops):
        if ops[0]["run_id"] == "1":
            raise RuntimeError("INVALID_PARAMETER_VALUE")  # refused by a server that answers
        if ops[0]["run_id"] == "2" and not up[0]:
            raise ConnectionError("refused")
        sent.append(ops[0]["run_id"])

    up = [False]
    assert drain(box, send, lambda: up[0]) == 3  # run 1 fails while "down": it and the rest are kept
    assert sent == ["0"] and [o["run_id"] for o in box.read()] == ["1", "2", "3"]
    up[0] = True
    assert drain(box, send, lambda: up[0]) == 0
    assert sent == ["0", "2", "3"] and not box.path.exists()
    assert box.rejected() == 1 and "INVALID_PARAMETER_VALUE" in box.rejected_path.read_text()


# ------------------------------------------------------------------ a real server, killed mid-run

def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


@pytest.mark.timeout(420)
def test_server_killed_mid_run_then_back_nothing_lost(tiny_data, tmp_path):
    from hibert.registry import client, resolve_model
    from hibert.runtime.dist_env import TRACKING_PENDING_EXIT_CODE

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = tracking_server(tmp_path / "server", port)
    run_dir = tmp_path / "runs" / "outage"
    steps = 10
    args = ["pretrain", *tiny_train_overrides(tmp_path / "runs", "outage", tiny_data["open"], **{
        "schedule.max_steps": steps, "checkpoint.every_steps": 100, "tracking.uri": uri,
        "tracking.retry_every_s": 1, "tracking.outage_wait_s": 3}), "--stage", "open-domain"]
    log = tmp_path / "first.log"
    proc = subprocess.Popen(HIBERT + args, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.time()
        while "step 2/" not in _log(log):  # training runs and has logged to the server
            assert proc.poll() is None and time.time() - t0 < 240, _log(log)[-3000:]
            time.sleep(0.1)
        kill_group(server)
        code = proc.wait(timeout=240)
    finally:
        kill_group(proc)
        kill_group(server)
    text = _log(log)
    assert code == TRACKING_PENDING_EXIT_CODE, text[-4000:]
    assert "stopped answering" in text and f"hibert registry sync {run_dir}" in text
    assert "Traceback" not in text
    # the export is there, its registration waits with the rest
    assert (run_dir / "export" / "encoder.safetensors").is_file()
    assert json.loads((run_dir / "export" / "registry.json").read_text()) == {
        "version": None, "uri": uri, "pending": True}
    kinds = [op["op"] for op in Outbox(run_dir).read()]
    assert kinds[-3:] == ["artifacts", "register", "end"] and "metrics" in kinds

    # the server comes back on the same store; the job starts again (a requeue) and sends everything
    server = tracking_server(tmp_path / "server", port)
    try:
        out = run_hibert(args, timeout=240)
        assert "already finished" in out.stderr
        assert not Outbox(run_dir).path.exists()
        assert json.loads((run_dir / "export" / "registry.json").read_text())["version"] == "1"
        c = client(uri)
        run_id = json.loads((run_dir / "export" / "export.json").read_text())["mlflow_run_id"]
        run = c.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert [m.step for m in c.get_metric_history(run_id, "lr")] == list(range(1, steps + 1))
        versions = c.search_model_versions("name='hibert-encoder'")
        assert [v.version for v in versions] == ["1"]
        local = resolve_model("models:/hibert-encoder@open-domain", uri, tmp_path / "pulled")
        assert (local / "encoder.safetensors").read_bytes() == (run_dir / "export" / "encoder.safetensors").read_bytes()
    finally:
        kill_group(server)


def test_registry_sync_sends_a_run_outbox(tmp_path):
    """`hibert registry sync RUN_DIR` on a sqlite store: metrics kept in the outbox arrive with their steps
    and times, the run is closed, and a second sync has nothing to send."""
    from hibert.config import load_config, save_resolved
    from hibert.registry import client
    from hibert.runtime.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config(None, [f"tracking.uri={uri}", f"run.output_dir={tmp_path}", "run.name=kept"])
    save_resolved(cfg, cfg.run_dir)
    tracker = Tracker(cfg, enabled=True)
    run_id = tracker.start(None, {"stage": "none"})
    box = Outbox(cfg.run_dir)
    for step in (1, 2, 3):
        box.append({"op": "metrics", "run_id": run_id, "values": {"loss": 4.0 - step}, "step": step,
                    "timestamp": 1_700_000_000_000 + step})
    box.append({"op": "end", "run_id": run_id, "status": "FINISHED"})
    out = run_hibert(["registry", "sync", cfg.run_dir])
    assert "sent 4 operation(s)" in out.stdout
    history = client(uri).get_metric_history(run_id, "loss")
    assert [(m.step, m.value, m.timestamp) for m in history] == [
        (s, 4.0 - s, 1_700_000_000_000 + s) for s in (1, 2, 3)]
    assert client(uri).get_run(run_id).info.status == "FINISHED"
    assert "nothing to send" in run_hibert(["registry", "sync", cfg.run_dir]).stdout


def test_a_full_artifact_store_stops_the_export_instead_of_registering_a_partial_copy(tmp_path, small_disk):
    """Uploading the export into a local store's artifact directory that fills up raises (the caller's one-line
    full-disk error) instead of being filed as "refused" and followed by a registration of a partial copy."""
    import os

    from hibert.config import load_config
    from hibert.errors import disk_full
    from hibert.runtime.tracking import Tracker

    small_disk.resize("8m")
    uri = f"sqlite:///{small_disk.path / 'mlflow.db'}"   # artifacts go next to it: <disk>/mlartifacts
    cfg = load_config(None, [f"tracking.uri={uri}", f"run.output_dir={tmp_path}", "run.name=full"])
    tracker = Tracker(cfg, enabled=True)
    tracker.start(None, {"stage": "none"})
    export = tmp_path / "export"
    export.mkdir()
    (export / "encoder.safetensors").write_bytes(os.urandom(3_000_000))
    used = os.statvfs(small_disk.path)
    small_disk.resize(f"{((used.f_blocks - used.f_bfree) * used.f_frsize + 1_000_000) // 1024}k")
    with pytest.raises(Exception) as e:
        tracker.artifacts(export, "export")
    assert disk_full(e.value)
    assert tracker.rejected() == 0 and not Outbox(cfg.run_dir).path.exists()
