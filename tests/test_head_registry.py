"""A head defined outside the project (tests/plugins/lead_head.py) trains, evaluates and summarizes through
the public commands after one `register_head` call, named in $HIBERT_HEADS; the registry refuses what it
cannot dispatch."""
import json
import os
from pathlib import Path

import pytest

from conftest import REPO, run_hibert, tiny_train_overrides

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_toy_head_runs_through_finetune_evaluate_and_summarize(tiny_data, tmp_path):
    env = dict(os.environ, HIBERT_HEADS="lead_head",
               PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "plugins"), os.environ.get("PYTHONPATH", "")]))
    over = tiny_train_overrides(tmp_path, "lead", tiny_data["cnndm"], **{
        "finetune.task": "lead-k", "schedule.max_steps": 2, "checkpoint.every_steps": 2})
    run_hibert(["finetune", *over, "--init", "random", "--nproc", "2"], timeout=400, env=env)
    export = tmp_path / "lead" / "export"
    assert json.loads((export / "export.json").read_text())["task"] == "lead-k"
    assert (export / "lead_head.safetensors").is_file()
    assert "loader_module: hibert.finetune.serving.pyfunc" in (export / "MLmodel").read_text()  # a pyfunc too
    from hibert.registry import list_versions

    versions = list_versions(f"sqlite:///{tmp_path / 'mlflow.db'}", "hibert-lead-k")
    assert [v["aliases"] for v in versions] == [["finetuned"]]  # the spec's registered model, the heads' alias

    out = run_hibert(["evaluate", *over, "--bootstrap", "50"], timeout=300, env=env)
    report = json.loads((tmp_path / "lead" / "report-test" / "report.json").read_text())
    assert report["meta"]["task"] == "lead-k" and {"model", "lead3", "oracle"} <= set(report["scores"])
    assert out.stdout.splitlines()[-2].startswith("report: ") and out.stdout.splitlines()[-1].startswith("viewer: ")

    article = tmp_path / "article.txt"
    article.write_text("The council met on Monday. It approved the budget. Taxes will rise. Schools get more. "
                       "The mayor spoke last.")
    out = run_hibert(["summarize", *over, "--input", str(article), "--json"], timeout=300, env=env)
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert s["note"] == "lead-k head" and len(s["summary"]) == 3 and s["num_sentences"] == 5

    # without the registration the same export is not dispatchable as lead-k: finetune names the head
    r = run_hibert(["finetune", *over], check=False, timeout=120)
    assert r.returncode == 1 and "finetune.task=lead-k: no such head" in r.stderr and "Traceback" not in r.stderr
    # the same with --nproc: one line from the launcher, before any rank starts
    launches = set((tmp_path / "lead").glob("launch-*"))
    r = run_hibert(["finetune", *over, "--nproc", "2"], check=False, timeout=120)
    assert r.returncode == 1 and r.stderr.count("finetune.task=lead-k: no such head") == 1, r.stderr[-2000:]
    assert "hibert: rank" not in r.stderr and set((tmp_path / "lead").glob("launch-*")) == launches, r.stderr[-2000:]


def test_registry_refuses_duplicates_and_dispatches_exports_on_their_task(tmp_path):
    from hibert.finetune.heads import HeadError, get_head, head_of_export, register_head, registered_heads

    heads = registered_heads()
    assert {"extractive", "abstractive", "ranker", "mds"} <= set(heads)
    with pytest.raises(HeadError, match="already registered"):
        register_head(heads["ranker"].__class__(**{**heads["ranker"].__dict__, "title": "another"}))
    with pytest.raises(HeadError, match="no such head"):
        get_head("nope")
    export = tmp_path / "e"
    export.mkdir()
    (export / "abstractive.json").write_text("{}")
    (export / "mds.json").write_text("{}")
    assert head_of_export(export).name == "mds"             # by its files, without export.json
    (export / "export.json").write_text(json.dumps({"task": "abstractive"}))
    assert head_of_export(export).name == "abstractive"     # export.json's task decides
    assert head_of_export(tmp_path).name == "extractive"    # nothing to go by: extractive, whose loader says why
