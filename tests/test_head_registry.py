"""A head defined outside the project (tests/plugins/lead_head.py) trains, evaluates, summarizes and is served
through the public commands after one `register_head` call, named in $HIBERT_HEADS — with a config section,
a flag and a served param of its own; the registry refuses what it cannot dispatch; the generic code (the
CLI, serving, corpus summarize, slurm/, the schema) names no head."""
import json
import os

import pytest

from conftest import REPO, run_hibert, tiny_train_overrides
from serving_helpers import invoke, served

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_toy_head_runs_through_finetune_evaluate_summarize_and_serving(tiny_data, tmp_path, monkeypatch):
    plugin = {"HIBERT_HEADS": "lead_head",
              "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "plugins"), os.environ.get("PYTHONPATH", "")])}
    env = dict(os.environ, **plugin)
    over = tiny_train_overrides(tmp_path, "lead", tiny_data["cnndm"], **{
        "finetune.task": "lead-k", "schedule.max_steps": 2, "checkpoint.every_steps": 2, "lead.sentences": 2})
    # its config section is the schema's: bounds checked at load time, one line naming the key
    r = run_hibert(["finetune", *over, "lead.sentences=0"], check=False, timeout=120, env=env)
    assert r.returncode == 2 and "lead.sentences: Input should be greater than or equal to 1" in r.stderr, r.stderr
    run_hibert(["finetune", *over, "--init", "random", "--nproc", "2"], timeout=400, env=env)
    export = tmp_path / "lead" / "export"
    assert json.loads((export / "export.json").read_text())["task"] == "lead-k"
    assert (export / "lead_head.safetensors").is_file()
    assert json.loads((export / "lead.json").read_text()) == {"sentences": 2}     # from its config section
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
    assert s["note"] == "lead-k head" and len(s["summary"]) == 2 and s["num_sentences"] == 5    # the model's own
    out = run_hibert(["summarize", *over, "--input", str(article), "--json", "--lead-sentences", "3"], timeout=300,
                     env=env)
    assert len(json.loads(out.stdout.strip().splitlines()[-1])["summary"]) == 3              # its own flag
    r = run_hibert(["summarize", *over, "--input", str(article), "--lead-sentences", "11"], check=False,
                   timeout=300, env=env)
    assert r.returncode == 2 and "--lead-sentences 11: must be <= 10" in r.stderr, r.stderr

    # served by `mlflow models serve`, its param typed by the signature and checked like the flag
    for var, value in plugin.items():
        monkeypatch.setenv(var, value)
    assert "lead_sentences" in (export / "MLmodel").read_text()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with served("models:/hibert-lead-k@finetuned", uri, tmp_path / "serve.log") as url:
        record = {"dataframe_records": [{"id": "a", "text": article.read_text()}]}
        status, body = invoke(url, {**record, "params": {"lead_sentences": 1}})
        assert status == 200 and len(body["predictions"][0]["summary"]) == 1, body
        status, body = invoke(url, record)
        assert status == 200 and len(body["predictions"][0]["summary"]) == 2, body
        status, body = invoke(url, {**record, "params": {"lead_sentences": 0}})
        assert status == 400 and "params.lead_sentences 0: must be >= 1" in str(body), body

    # without the registration its config section is no key, and the run is not dispatchable as lead-k: finetune
    # names the head
    for var in plugin:
        monkeypatch.delenv(var)
    r = run_hibert(["finetune", *over], check=False, timeout=120)
    assert r.returncode == 2 and "lead: unknown key" in r.stderr and "Traceback" not in r.stderr, r.stderr
    over = [o for o in over if not o.startswith("lead.")]
    r = run_hibert(["finetune", *over], check=False, timeout=120)
    assert r.returncode == 1 and "finetune.task=lead-k: no such head" in r.stderr and "Traceback" not in r.stderr
    # the same with --nproc: one line from the launcher, before any rank starts
    launches = set((tmp_path / "lead").glob("launch-*"))
    r = run_hibert(["finetune", *over, "--nproc", "2"], check=False, timeout=120)
    assert r.returncode == 1 and r.stderr.count("finetune.task=lead-k: no such head") == 1, r.stderr[-2000:]
    assert "hibert: rank" not in r.stderr and set((tmp_path / "lead").glob("launch-*")) == launches, r.stderr[-2000:]


def test_registry_refuses_duplicates_and_dispatches_exports_on_their_task(tmp_path):
    from hibert.heads import HeadError, get_head, head_of_export, register_head, registered_heads

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
