"""The main job (`make demo`) end to end on the shipped sample, capped to a few steps per stage."""
import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_demo_pipeline_runs_every_stage_and_reuses_them(tmp_path, repo):
    cmd = [sys.executable, "-m", "hibert.demo", "demo", f"run.output_dir={tmp_path}", "schedule.max_steps=4",
           "schedule.eval_every=2", "schedule.log_every=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1100, cwd=repo)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    for stage in ["prep-open", "prep-cnndm", "pretrain-open", "pretrain-in", "finetune", "evaluate",
                  "finetune-random", "evaluate-random", "finetune-abs", "evaluate-abs", "finetune-abs-random",
                  "evaluate-abs-random"]:
        assert f"{stage:<14} done" in out.stdout, stage
    assert "ROUGE F1" in out.stdout and "lead3" in out.stdout and "oracle" in out.stdout
    assert "extractive summary of a held-back article" in out.stdout and "mlflow ui" in out.stdout
    assert "abstractive summary of a held-back article" in out.stdout and "novel 1/2/3-grams" in out.stdout
    assert (tmp_path / "report" / "loss_curves.png").is_file()
    # the runs compared in one place: the pretrained and random-init models of each head, Lead-3, the oracle
    comparison = (tmp_path / "report" / "comparison.md").read_text()
    assert "finetune-random (random init)" in comparison and "finetune - finetune-random (paired" in comparison
    assert (tmp_path / "report" / "comparison.png").stat().st_size > 20_000
    report = json.loads((tmp_path / "finetune" / "report-test" / "report.json").read_text())
    assert report["meta"]["encoder_init"] == "models:/hibert-encoder@in-domain"
    from hibert.registry import list_versions

    aliases = {a for r in list_versions(f"sqlite:///{tmp_path / 'mlflow.db'}") for a in r["aliases"]}
    assert {"open-domain", "in-domain", "finetuned"} <= aliases
    assert [r["aliases"] for r in list_versions(f"sqlite:///{tmp_path / 'mlflow.db'}", "hibert-abstractive")] == [
        ["finetuned"]]
    abstract = json.loads((tmp_path / "finetune-abs" / "report-test" / "report.json").read_text())
    assert abstract["meta"]["task"] == "abstractive" and "abstractiveness" in abstract
    # four steps of training cannot write: the demo says so instead of printing repeated pieces as a summary
    assert "(not shown) this model's decoder cannot write yet" in out.stdout
    # where the output viewer is; the model to serve is the extractive one (the abstractive one cannot write yet,
    # and its registered version says so)
    assert f"viewer:       {tmp_path / 'finetune-abs' / 'report-test' / 'viewer.html'}" in out.stdout
    assert ".venv/bin/hibert serve models:/hibert-extractive/1 --port" in out.stdout
    assert "not served:   models:/hibert-abstractive/1: this model's decoder cannot write yet" in out.stdout
    from hibert.registry import client

    store = client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    abs_version = store.get_model_version("hibert-abstractive", "1")
    assert abs_version.tags["writes"] == "no" and "cannot write yet" in abs_version.description
    ext_version = store.get_model_version("hibert-extractive", "1")
    assert "trained" in ext_version.description.lower() and ext_version.tags["task"] == "extractive"
    notes = abstract["meta"]["notes"]
    assert notes and "cannot write yet" in notes[0]
    assert "cannot write yet" in (tmp_path / "finetune-abs" / "report-test" / "viewer.html").read_text()
    evaluations = store.search_runs([store.get_experiment_by_name("hibert").experiment_id],
                                    filter_string="tags.stage = 'evaluate'")
    finetune_runs = {r.info.run_id for r in store.search_runs(
        [store.get_experiment_by_name("hibert").experiment_id], filter_string="tags.stage = 'finetune'")}
    assert evaluations and all(r.data.tags["mlflow.parentRunId"] in finetune_runs for r in evaluations)
    mlflow_ui_opens_on_the_runs(tmp_path, out.stdout)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=repo)
    assert again.returncode == 0 and again.stdout.count("reused") >= 12
    # --seeds: the extractive stage once more per seed (one seed keeps the test short: the unseeded run is
    # the other member), its evaluation per seed; the encoders are reused
    seeded = subprocess.run([*cmd, "--seeds", "1", "--stages", "finetune,evaluate"], capture_output=True,
                            text=True, timeout=600, cwd=repo)
    assert seeded.returncode == 0, seeded.stdout[-4000:] + seeded.stderr[-4000:]
    assert "pretrain-in    reused" in seeded.stdout
    for stage in ("finetune-seed1", "evaluate-seed1"):
        assert f"{stage:<14} done" in seeded.stdout, stage
    assert (tmp_path / "finetune-seed1" / "report-test" / "report.json").is_file()
    assert "finetune (hibert-encoder@in-domain), 2 seeds" in seeded.stdout   # the unseeded run + seed 1


def mlflow_ui_opens_on_the_runs(root, printed: str) -> None:
    """The MLflow UI link the demo prints, in headless Chromium against a real `mlflow ui`: the first page is the
    runs table (run names in the DOM), not MLflow 3's empty GenAI overview; a screenshot of it is written."""
    import re
    import shutil
    import tempfile
    import time
    import urllib.request
    from pathlib import Path

    from serving_helpers import free_port, kill_group

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium)")
    link = re.search(r"then open (http://localhost:5000/\S+)\)", printed)
    assert link, printed[-2000:]
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(mlflow), "ui", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=open(root / "ui.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.time() - t0 < 90, (root / "ui.log").read_text()[-2000:]
                time.sleep(0.3)
        url = link.group(1).replace("localhost:5000", f"127.0.0.1:{port}")
        with tempfile.TemporaryDirectory() as profile:
            base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
                    "--virtual-time-budget=20000"]
            dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
            shot = root / "mlflow_ui.png"
            subprocess.run([*base, "--window-size=1280,900", f"--screenshot={shot}", url], capture_output=True,
                           timeout=180)
        assert "pretrain-open" in dom and "finetune-abs" in dom, dom[-3000:]   # the runs table, first
        assert shot.is_file() and shot.stat().st_size > 20_000
    finally:
        kill_group(proc)
