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
    # where the output viewer is, and how to serve the registered abstractive model
    assert f"viewer:       {tmp_path / 'finetune-abs' / 'report-test' / 'viewer.html'}" in out.stdout
    assert "mlflow models serve -m models:/hibert-abstractive/1 --env-manager local" in out.stdout
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
