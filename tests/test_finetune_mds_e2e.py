"""Multi-document summarization end to end on SYNTHETIC clusters built from the CNN/DM sample: `hibert
synth-clusters` -> `hibert prep` (clusters) -> the ranker (2 ranks; registered as hibert-ranker) -> the hierarchical
summarizer reading the units the registered ranker picks (2 ranks, ZeRO-2, PHT + copy + graph + structural
attention; hibert-mds) and the flat baseline -> `hibert evaluate` for both kinds -> `hibert summarize` on a
cluster. Real DeepSpeed, MLflow and ROUGE."""
import json
import shutil
import subprocess

import pytest

from conftest import HIBERT, REPO, run_hibert, tiny_train_overrides
from test_pretrain_deepspeed import metric_history

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SHORT = {"schedule.batch_tokens": 3000, "schedule.max_docs_per_batch": 4, "finetune.eval_decode_docs": 3,
         "checkpoint.every_steps": 4, "mds.budget_tokens": 300}
MDS = {"finetune.task": "mds", "mds.ranking": "models:/hibert-ranker@finetuned", "mds.global_layers": 1,
       "mds.graph_attention": True, "mds.structural_attention": True, "decoder.layers": 1,
       "decoder.cross_attention": "pht", "decoder.copy": True, "finetune.max_target_tokens": 30,
       "generation.max_length": 10, "generation.beam_size": 2, "schedule.max_steps": 4, "schedule.eval_every": 4}


@pytest.fixture(scope="module")
def clusters(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("mds")
    spec = "documents_field: documents, summary_field: summary, id_field: id, summary_sentence_sep: ' . ', " \
           "ptb_tokenized: true, synthetic: true"
    sources = []
    for split, name, n in (("train", "train", 24), ("val", "valid", 6)):
        lines = (REPO / "samples" / f"cnndm_{split}_sample.jsonl").read_text().splitlines()[:n]
        src = root / f"{split}.jsonl"
        src.write_text("\n".join(lines) + "\n")
        out = run_hibert(["synth-clusters", "--input", src, "--output", root / f"syn_{split}.jsonl", "--id-field",
                          "idx", "--neighbours", "2", "--min-similarity", "0.05"])
        assert "SYNTHETIC clusters" in out.stdout
        sources.append(f"{{format: jsonl, path: '{root / f'syn_{split}.jsonl'}', {spec}, split: {name}}}")
    run_hibert(["prep", f"data.output={root / 'data'}", f"data.tokenizer.model={tiny_data['open'] / 'tokenizer.model'}",
                "data.valid_fraction=0", "data.test_fraction=0", f"data.sources=[{', '.join(sources)}]"])
    stats = json.loads((root / "syn_train.jsonl.stats.json").read_text())
    assert stats["records_in"] == stats["written"] + sum(stats["skipped"].values()) and stats["synthetic"]
    return root


@pytest.fixture(scope="module")
def trained(clusters):
    root = clusters
    ranker = tiny_train_overrides(root, "ranker", root / "data", **{
        **SHORT, "finetune.task": "ranker", "schedule.max_steps": 6, "schedule.eval_every": 3})
    run_hibert(["finetune", *ranker, "--init", "random", "--nproc", "2"], timeout=300)  # ZeRO-2 across 2 ranks
    mds = tiny_train_overrides(root, "mds", root / "data", **{**SHORT, **MDS})
    run_hibert(["finetune", *mds, "--init", "random", "--nproc", "2"], timeout=400)
    flat = tiny_train_overrides(root, "flat", root / "data", **{
        **SHORT, **MDS, "finetune.task": "abstractive", "tracking.register_model": False})
    run_hibert(["finetune", *flat, "--init", "random"], timeout=300)
    return root, ranker, mds, flat


def test_ranker_and_summarizer_train_select_and_register(trained):
    from hibert.registry import list_versions

    root, *_ = trained
    assert len(metric_history(root, "ranker", "valid_recall5")) == 2
    assert metric_history(root, "mds", "valid_rouge")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    assert list_versions(uri, "hibert-ranker")[-1]["aliases"] == ["finetuned"]
    assert list_versions(uri, "hibert-mds")[-1]["aliases"] == ["finetuned"]
    export = root / "mds" / "export"
    mds = json.loads((export / "mds.json").read_text())["mds"]
    # the alias the recipe names, pinned to the version that ranked the training split
    assert mds["graph_attention"] and mds["structural_attention"] and mds["global_layer"] == "liu_lapata"
    assert mds["graph_weighting"] == "eq25"
    assert mds["ranking"] == f"models:/hibert-ranker/{list_versions(uri, 'hibert-ranker')[-1]['version']}"
    assert (root / "mds" / "rankings" / "train.npz").is_file()   # the registered ranker's scores, once
    flat = json.loads((root / "flat" / "export" / "abstractive.json").read_text())
    assert flat["mds"]["budget_tokens"] == 300   # the flat baseline records how its units were read
    assert flat["mds"]["ranking"] == mds["ranking"]


def test_evaluate_ranker_and_summarizer_reports(trained, tmp_path):
    root, ranker, mds, flat = trained
    out = run_hibert(["evaluate", *ranker, "--split", "valid", "--bootstrap", "100"], timeout=300)
    rep = json.loads((root / "ranker" / "report-valid" / "report.json").read_text())
    assert set(rep["recall"]) == {"ranker", "tfidf", "document_order", "oracle"}
    assert set(rep["recall"]["ranker"]) == {"5", "10", "20", "40"} and "ranker-tfidf" in rep["paired"]
    assert rep["meta"]["clusters"] == "synthetic" and rep["meta"]["num_clusters"] == len(rep["per_cluster"]["doc_ids"])
    assert "SYNTHETIC" in (root / "ranker" / "report-valid" / "report.md").read_text() and "L'=5" in out.stdout
    import mlflow   # the ranker's evaluation is an MLflow run like every other head's

    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("hibert").experiment_id], "tags.stage = 'evaluate'")[0]
    assert run.data.metrics["ranker_recall_at_5"] == pytest.approx(rep["recall"]["ranker"]["5"]["mean"])
    run_hibert(["evaluate", *flat, "--split", "valid", "--bootstrap", "100"], timeout=300)
    run_hibert(["evaluate", *mds, "--split", "valid", "--bootstrap", "100", "--compare",
                f"flat={root / 'flat'}"], timeout=300)
    rep = json.loads((root / "mds" / "report-valid" / "report.json").read_text())
    assert set(rep["scores"]) == {"model", "lead3_first_doc", "lead_gold_length", "lead_ranked",
                                 "tfidf_extract"}
    assert "model-flat" in rep["paired"] and rep["meta"]["clusters"] == "synthetic"
    assert "SYNTHETIC" in rep["meta"]["task"] and rep["num_documents"] >= 3
    assert rep["meta"]["reads"].startswith("units ranked by models:/hibert-ranker/")
    assert "<= 300 tokens (trained on 300)" in rep["meta"]["reads"]
    assert rep["meta"]["unit_graph"].startswith("eq. 25 tf-idf")   # the report says which graph the model read
    # Liu & Lapata's generalisation test: trained on one budget, read twice as much at test time
    run_hibert(["evaluate", *mds, "--split", "valid", "--budget-tokens", "600", "--limit", "2", "--bootstrap", "50",
                "--out", tmp_path / "budget-600"], timeout=300)
    wide = json.loads((tmp_path / "budget-600" / "report.json").read_text())
    assert "<= 600 tokens (trained on 300)" in wide["meta"]["reads"] and wide["num_documents"] == 2
    # a model trained on oracle-ranked units reads the references: refused unless asked for, then labelled
    oracle = tmp_path / "oracle-export"
    shutil.copytree(root / "mds" / "export", oracle)
    settings = json.loads((oracle / "mds.json").read_text())
    (oracle / "mds.json").write_text(json.dumps({"mds": {**settings["mds"], "ranking": "oracle"}}))
    refused = subprocess.run(HIBERT + ["evaluate", *mds, "--model", str(oracle), "--split", "valid"],
                             capture_output=True, text=True, timeout=200)
    assert refused.returncode != 0 and "ranks units with the oracle" in refused.stderr
    run_hibert(["evaluate", *mds, "--model", oracle, "--split", "valid", "--ranking", "oracle", "--limit", "2",
                "--bootstrap", "50", "--out", tmp_path / "oracle-report"], timeout=300)
    assert "upper bound" in (tmp_path / "oracle-report" / "report.md").read_text()


def test_summarize_a_cluster_and_refusals(trained, tmp_path):
    root, _, mds, _ = trained
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("The storm hit the coast on Monday. Power lines fell in three towns.\n\nSchools closed.")
    b.write_text("Heavy rain followed the storm. Rivers rose quickly.")
    out = run_hibert(["summarize", *mds, "--input", a, "--input", b, "--json", "--beam", "2"], timeout=200)
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["num_sentences"] == 5 and "2 documents" in rec["note"]
    lines = tmp_path / "c.jsonl"
    lines.write_text(json.dumps({"documents": [a.read_text(), b.read_text()]}) + "\n" + json.dumps({"documents": 3}))
    bad = subprocess.run(HIBERT + ["summarize", *mds, "--input", str(lines)], capture_output=True, text=True,
                         timeout=200)
    assert bad.returncode == 2 and "c.jsonl:2" in bad.stderr and "Traceback" not in bad.stderr
    flat_two = subprocess.run(HIBERT + ["summarize", *mds, "--model", str(root / "flat" / "export"), "--input",
                                        str(a), "--input", str(b)], capture_output=True, text=True, timeout=200)
    assert flat_two.returncode == 2 and "multi-document (mds) model" in flat_two.stderr


def test_mds_kill9_then_resume_is_bit_identical(trained):
    # the cluster task on the shared runtime: killed after its step-2 checkpoint, restarted, the same weights as
    # the uninterrupted run (ranker scores are read back from <run>/rankings/, the loader restarts mid-epoch)
    import os
    import signal

    from safetensors.torch import load_file

    from test_pretrain_deepspeed import _start, _wait_for, assert_same

    root, _, mds, _ = trained
    args = ["finetune", *mds, "run.name=mds-resume", "checkpoint.every_steps=2", "tracking.register_model=false",
            "--init", "random", "--nproc", "2"]
    proc = _start(args, root / "mds-resume.log")
    try:
        _wait_for(root / "mds-resume" / "checkpoints" / "step_000000002" / "COMPLETE.json", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert not (root / "mds-resume" / "export").exists()
    out = run_hibert(args, timeout=300)
    assert "resumed from" in out.stderr

    def weights(run: str) -> dict:
        return {f"{f.name}:{k}": v for f in sorted((root / run / "export").glob("*.safetensors"))
                for k, v in load_file(str(f)).items()}

    assert_same(weights("mds"), weights("mds-resume"))


def test_pyfunc_cluster_served_like_summarize(trained, tmp_path, monkeypatch):
    """The registered mds version (its units ranked by the registered ranker) served by `mlflow models serve`:
    a `documents` list per row gives the abstract `hibert summarize` gives for the same cluster."""
    from serving_helpers import invoke, served

    root, _, mds, _ = trained
    clusters = [["The storm hit the coast on Monday. Power lines fell in three towns.\n\nSchools closed.",
                 "Heavy rain followed the storm. Rivers rose quickly."],
                ["The team won the cup final. Fans celebrated in the streets.", "The coach praised the defence."]]
    lines = tmp_path / "clusters.jsonl"
    lines.write_text("".join(json.dumps({"documents": c}) + "\n" for c in clusters))
    out = run_hibert(["summarize", *mds, "--model", "models:/hibert-mds@finetuned", "--input", lines, "--json",
                      "--beam", "1"], timeout=200)
    want = [r["summary"] for r in map(json.loads, out.stdout.splitlines())]
    with served("models:/hibert-mds@finetuned", f"sqlite:///{root / 'mlflow.db'}", tmp_path / "serve.log") as url:
        status, body = invoke(url, {"dataframe_records": [{"documents": c} for c in clusters], "params": {"beam": 1}})
        assert status == 200 and [p["summary"] for p in body["predictions"]] == want, body
        status, body = invoke(url, {"dataframe_records": [{"text": "One document."}]})
        assert status == 400 and "missing inputs ['documents']" in body["message"]
        status, body = invoke(url, {"dataframe_records": [{"documents": ["", " "]}]})
        assert status == 400 and "every document of the cluster is empty" in body["message"]
