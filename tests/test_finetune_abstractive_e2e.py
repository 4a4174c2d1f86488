"""The abstractive head end to end on the prepared CNN/DM sample: real DeepSpeed (2 CPU ranks, gloo), exact
resume after kill -9, ZeRO-3, MLflow registry, evaluation report and `hibert summarize`."""
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from conftest import HIBERT, REPO, render_in_chromium, run_hibert, tiny_train_overrides
from serving_helpers import free_port, kill_group, tracking_server
from test_pretrain_deepspeed import _start, _wait_for, assert_same, metric_history

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ABSTRACTIVE = {"finetune.task": "abstractive", "decoder.layers": 2, "decoder.cross_attention": "pht",
               "finetune.max_target_tokens": 40, "finetune.eval_decode_docs": 3, "generation.max_length": 20,
               "generation.beam_size": 2, "schedule.max_steps": 8, "schedule.eval_every": 4,
               "checkpoint.every_steps": 4, "checkpoint.keep_best": 0, "optimizer.lr": 2e-3,
               "objective.label_smoothing": 0.1, "finetune.encoder_lr_scale": 0.5, "finetune.encoder_warmup_steps": 4}


def overrides(root, name, tiny_data, **extra):
    return tiny_train_overrides(root, name, tiny_data["cnndm"], **{**ABSTRACTIVE, **extra})


def weights(run_dir):
    export = run_dir / "export"
    return {**load_file(str(export / "encoder.safetensors")), **load_file(str(export / "decoder.safetensors"))}


@pytest.fixture(scope="module")
def reference(tiny_data, tmp_path_factory):
    """An uninterrupted 2-rank ZeRO-2 abstractive run of 8 steps."""
    root = tmp_path_factory.mktemp("abs")
    over = overrides(root, "abs", tiny_data)
    run_hibert(["finetune", *over, "--init", "random", "--nproc", "2"], timeout=400)
    return root, over


def test_trains_selects_on_rouge_exports_and_registers(reference):
    from hibert.registry import list_versions

    root, _ = reference
    losses = metric_history(root, "abs", "train_loss")
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses
    assert len(metric_history(root, "abs", "valid_rouge")) == 2  # decoded validation ROUGE at steps 4 and 8
    export = root / "abs" / "export"
    gen = json.loads((export / "generation.json").read_text())
    assert gen["beam_size"] == 2 and gen["max_length"] == 20
    assert json.loads((export / "abstractive.json").read_text())["decoder"]["cross_attention"] == "pht"
    assert json.loads((export / "export.json").read_text())["task"] == "abstractive"
    versions = list_versions(f"sqlite:///{root / 'mlflow.db'}", "hibert-abstractive")
    assert versions and versions[-1]["aliases"] == ["finetuned"]


def test_kill9_then_resume_is_bit_identical(reference, tiny_data, tmp_path):
    root, _ = reference
    args = ["finetune", *overrides(tmp_path, "abs", tiny_data), "--init", "random", "--nproc", "2"]
    proc = _start(args, tmp_path / "first.log")
    try:
        _wait_for(tmp_path / "abs" / "checkpoints" / "step_000000004" / "COMPLETE.json", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert not (tmp_path / "abs" / "export").exists()
    out = run_hibert(args, timeout=300)
    assert "resumed from" in out.stderr
    assert_same(weights(root / "abs"), weights(tmp_path / "abs"))


def test_zero3_with_tied_embeddings_trains_and_exports(tiny_data, tmp_path):
    """ZeRO-3 with the tied table, copy and See et al.'s coverage (its loss summed across the 2 ranks)."""
    run_hibert(["finetune", *overrides(tmp_path, "z3", tiny_data, **{
        "deepspeed.zero_stage": 3, "schedule.max_steps": 3, "schedule.eval_every": 3, "decoder.copy": True,
        "decoder.coverage": True, "decoder.cross_attention": "flat"}), "--init", "random", "--nproc", "2"], timeout=300)
    w = weights(tmp_path / "z3")
    assert all(np.isfinite(v.numpy()).all() for v in w.values())
    assert any(k.endswith("cross.coverage") for k in w)
    cov = metric_history(tmp_path, "z3", "valid_coverage_loss")
    assert cov and all(0 < c < 100 for c in cov)


def test_evaluate_reports_abstractive_stats_and_pairs_other_runs(reference, tmp_path):
    """... and an evaluation whose tracking server is away keeps its MLflow run (report, scores, per-document
    table) until `hibert registry sync` sends it to the server, back."""
    import mlflow

    root, over = reference
    port = free_port()
    away = run_hibert(["evaluate", *over, "--split", "valid", "--bootstrap", "100", "--beam", "1",
                       "--out", tmp_path / "greedy", f"tracking.uri=http://127.0.0.1:{port}"], timeout=300)
    keep = root / "abs" / "evaluate-outbox"
    assert f"is unreachable: the report is in {tmp_path / 'greedy'}" in away.stderr
    assert f"hibert registry sync {keep}" in away.stderr and (tmp_path / "greedy" / "report.json").is_file()
    server = tracking_server(tmp_path / "server", port)
    try:
        run_hibert(["registry", "sync", keep], timeout=120)
        client = mlflow.MlflowClient(f"http://127.0.0.1:{port}")
        run = client.search_runs([client.get_experiment_by_name("hibert").experiment_id], "tags.stage = 'evaluate'")[0]
        assert run.info.status == "FINISHED" and "model_rouge1_f" in run.data.metrics
        assert {"report/report.json", "report/per_document.json"} <= {
            a.path for a in client.list_artifacts(run.info.run_id, "report")}
    finally:
        kill_group(server)
    out = run_hibert(["evaluate", *over, "--split", "valid", "--bootstrap", "100",
                      "--compare", f"greedy={tmp_path / 'greedy'}"], timeout=300)
    assert not keep.exists()   # everything sent: no empty outbox left to read as pending work
    report = json.loads((root / "abs" / "report-valid" / "report.json").read_text())
    assert set(report["scores"]) == {"model", "lead3", "oracle"}
    assert {"model-lead3", "model-oracle", "model-greedy"} <= set(report["paired"])
    stats = report["abstractiveness"]["model"]
    assert {"novel_1gram", "novel_4gram", "repeated_3gram", "mean_words"} <= set(stats)
    assert report["abstractiveness"]["lead3"]["novel_2gram"] == 0.0  # an extract has no novel n-grams
    assert report["meta"]["generation"]["beam_size"] == 2 and "model-greedy" in out.stdout
    # the output viewer, rendered by a real headless browser; the per-document rows are an MLflow table
    viewer = root / "abs" / "report-valid" / "viewer.html"
    assert f"viewer: {viewer}" in out.stdout
    dom = render_in_chromium(viewer, "worst&open=0", tmp_path / "viewer.png")
    assert dom.count('<tr class="doc"') == report["num_documents"] > 0
    assert re.search(r'<div class="sent[^"]*pick-oracle', dom)          # the oracle's picks marked in the source
    assert re.search(r'<mark class="copy">[^<]+</mark>', dom) or '<span class="novel">' in dom
    assert (tmp_path / "viewer.png").stat().st_size > 10_000
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("hibert").experiment_id],
                             "tags.stage = 'evaluate'", order_by=["start_time DESC"])[0]
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert {"report/viewer.html", "report/per_document.json"} <= logged
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "report/per_document.json",
                                                      str(tmp_path))).read_text())
    assert len(table["data"]) == 3 * report["num_documents"] and "rouge1_f" in table["columns"]


def test_summarize_raw_text_and_refusals(reference, tmp_path, tiny_data):
    root, over = reference
    text = "The council approved the budget on Monday. It funds three schools. Critics said taxes rise."
    out = subprocess.run(HIBERT + ["summarize", *over, "--json", "--beam", "3", "--max-len", "12"], input=text,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["num_sentences"] == 3 and isinstance(rec["summary"], list)
    bad = subprocess.run(HIBERT + ["summarize", *over, "--input", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "is not a file" in bad.stderr and "Traceback" not in bad.stderr
    # an init of another size is refused before training
    wrong = run_hibert(["finetune", *overrides(tmp_path, "wrong", tiny_data, **{"model.hidden": 32}),
                        "--init", str(root / "abs" / "export")], timeout=200, check=False)
    assert wrong.returncode != 0 and "model.hidden=64 differs" in wrong.stderr and "Traceback" not in wrong.stderr


def _eos_first_copy(export, dst):
    """A copy of `export` whose decoder wants to end every summary at once: its last layer's output LayerNorm
    gives every position the same state u (weight 0, bias u) and the tied output row of EOS is 50 u, so EOS
    out-scores every other subword by ~50 nats at every step. Only --min-len can make it write anything."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from hibert.tokens import EOS_ID

    shutil.copytree(export, dst)
    enc, dec = load_file(str(dst / "encoder.safetensors")), load_file(str(dst / "decoder.safetensors"))
    last = max(int(k.split(".")[2]) for k in dec if k.startswith("decoder.layers."))
    u = torch.ones(enc["token_embedding.weight"].shape[1]) / enc["token_embedding.weight"].shape[1] ** 0.5
    dec[f"decoder.layers.{last}.ffn_norm.weight"] = torch.zeros_like(u)
    dec[f"decoder.layers.{last}.ffn_norm.bias"] = u
    enc["token_embedding.weight"][EOS_ID] = 50 * u
    save_file(enc, str(dst / "encoder.safetensors"))
    save_file(dec, str(dst / "decoder.safetensors"))
    return dst


def test_summarize_decoding_flags_reach_the_decoder(reference, tmp_path):
    """--min-len, --max-len, --length-penalty, --no-repeat-ngram and --batch-size on the trained model (subword
    lengths from --json), and --min-len where it binds (a copy of the model that ends summaries at once)."""
    root, over = reference
    docs = tmp_path / "docs.jsonl"
    articles = [json.loads(line)["article"] for line in
                (REPO / "samples" / "cnndm_test_sample.jsonl").read_text().splitlines()[:3]]
    docs.write_text("".join(json.dumps({"text": a}) + "\n" for a in articles))

    def summarize(*flags, model=root / "abs" / "export"):
        out = run_hibert(["summarize", *over, "--model", model, "--input", docs, "--json", *flags], timeout=180)
        recs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        assert len(recs) == 3, out.stdout
        return recs

    flags = ["--beam", "2", "--min-len", "15", "--max-len", "19", "--length-penalty", "1.5", "--no-repeat-ngram", "1"]
    one = summarize(*flags, "--batch-size", "1")
    assert all(15 <= r["subwords"] <= 19 for r in one), one
    for r in one:   # n-gram blocking at 1: no word twice (words are ▁-started pieces; "" = a lone ▁)
        words = [w for s in r["summary"] for w in s.split(" ") if w]
        assert len(words) == len(set(words)), r["summary"]
    assert summarize(*flags, "--batch-size", "2") == one   # documents decode as they do alone
    eager = _eos_first_copy(root / "abs" / "export", tmp_path / "eos-first")
    assert [r["subwords"] for r in summarize(model=eager)] == [0, 0, 0]   # the model's own min_length 0
    assert [r["subwords"] for r in summarize("--min-len", "7", model=eager)] == [7, 7, 7]  # EOS as soon as allowed
    # a maximum beyond the decoder's positions (abstractive.json: 512) is refused before the model loads
    bad = run_hibert(["summarize", *over, "--input", docs, "--max-len", "512"], check=False)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "hibert summarize: --max-len 512: the model's decoder has 512 target positions (decoder.max_positions in "
        "abstractive.json), so at most --max-len 511"), bad.stderr


def test_registered_version_is_a_pyfunc_model_served_by_mlflow_like_summarize(reference, tmp_path, monkeypatch):
    """The registered version loads with mlflow.pyfunc and `mlflow models serve` answers POST /invocations with
    what `hibert summarize --json` prints (default and given decoding settings); malformed requests get 400 with
    a message and the server keeps answering."""
    import mlflow
    import pandas as pd

    from serving_helpers import invoke, mlflow_store, served

    root, over = reference
    uri, model = f"sqlite:///{root / 'mlflow.db'}", "models:/hibert-abstractive@finetuned"
    articles = [json.loads(line)["article"] for line in
                (REPO / "samples" / "cnndm_test_sample.jsonl").read_text().splitlines()[:3]]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": a}) + "\n" for a in articles))

    def cli(*flags):
        out = run_hibert(["summarize", *over, "--model", model, "--input", docs, "--json", *flags], timeout=180)
        return [(r["summary"], r["subwords"]) for r in map(json.loads, out.stdout.splitlines()) if r]

    flags, params = ["--beam", "1", "--max-len", "12", "--no-repeat-ngram", "2"], {"beam": 1, "max_len": 12,
                                                                                   "no_repeat_ngram": 2}
    want_default, want_params = cli(), cli(*flags)
    with mlflow_store(uri, monkeypatch):
        loaded = mlflow.pyfunc.load_model(model)
    assert loaded.metadata.get_params_schema() is not None
    got = loaded.predict(pd.DataFrame({"text": articles}))
    assert list(zip(got["summary"], got["subwords"])) == want_default
    got = loaded.predict(pd.DataFrame({"text": articles, "id": ["a", "b", "c"]}), params=params)
    assert list(zip(got["summary"], got["subwords"])) == want_params and list(got["id"]) == ["a", "b", "c"]
    # the server bounds a request's batch (16 by default); an operator raises the bound at load time, for
    # `mlflow models serve` through MLflow's override of the model_config the flavor declares
    with mlflow_store(uri, monkeypatch):
        monkeypatch.setenv("MLFLOW_PYFUNC_INFERENCE_CONFIG", '{"max_batch_size": 64}')
        wide = mlflow.pyfunc.load_model(model)
        monkeypatch.delenv("MLFLOW_PYFUNC_INFERENCE_CONFIG")
    got = wide.predict(pd.DataFrame({"text": articles}), params={**params, "batch_size": 64})
    assert list(zip(got["summary"], got["subwords"])) == want_params

    with served(model, uri, tmp_path / "serve.log") as url:
        status, body = invoke(url, {"dataframe_split": {"columns": ["text"], "data": [[a] for a in articles]},
                                    "params": params})
        assert status == 200 and [(p["summary"], p["subwords"]) for p in body["predictions"]] == want_params
        status, body = invoke(url, {"dataframe_records": [{"id": "one", "text": articles[0]}]})
        assert status == 200 and body["predictions"][0]["id"] == "one"
        assert (body["predictions"][0]["summary"], body["predictions"][0]["subwords"]) == want_default[0]
        limit = json.loads((root / "abs" / "export" / "export.json").read_text())["data"]["limits"]["max_doc_chars"]
        for payload, needle in [
                ({"dataframe_records": [{"txt": "a"}]}, "missing inputs ['text']"),
                ({"dataframe_records": [{"text": 3}]}, "'text' must be a string"),
                ({"dataframe_records": [{"text": "  "}]}, "'text' is empty"),
                ({"dataframe_records": [{"text": "Hi."}], "params": {"beam": 0}}, "params.beam 0: must be >= 1"),
                ({"dataframe_records": [{"text": "Hi."}], "params": {"beam": "x"}}, "beam"),
                ({"dataframe_records": [{"text": "Hi."}], "params": {"min_len": 9, "max_len": 3}},
                 "params.min_len 9 is above params.max_len 3"),
                ({"dataframe_records": [{"text": "Hi."}], "params": {"batch_size": 64}},
                 "at most 16 documents together"),
                ({"dataframe_records": [{"text": "a b. " * (limit // 5 + 1)}]}, "above the"),
                (b"{not json", "valid JSON")]:
            status, body = invoke(url, payload)
            assert 400 <= status < 500 and needle in body["message"], (payload if isinstance(payload, bytes)
                                                                       else str(payload)[:200], status, body)
        status, body = invoke(url, {"dataframe_records": [{"text": articles[1]}], "params": params})
        assert status == 200 and (body["predictions"][0]["summary"], body["predictions"][0]["subwords"]) == \
            want_params[1]


def test_the_served_abstractive_model_writes_what_evaluate_scored(reference, tmp_path, monkeypatch):
    """On the same documents (the test split's first chunks, given as text that segments and encodes to the
    evaluated subword ids), `hibert evaluate`'s summaries (report.json `outputs`) are what `hibert summarize
    --json` prints and what the pyfunc model answers, with the model's own decoding settings; and every answer's
    note begins with the model's "cannot write yet" (a tiny model's validation perplexity is far above it)."""
    import mlflow
    import numpy as np
    import pandas as pd

    from hibert.data_prep import DocumentDataset
    from hibert.finetune.inference.text import TextEncoder
    from serving_helpers import mlflow_store

    root, over = reference
    export = root / "abs" / "export"
    run_hibert(["evaluate", *over, "--bootstrap", "20", "--out", tmp_path / "report"], timeout=300)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    evaluated = dict(zip(report["per_document"]["doc_ids"], report["outputs"]["model"]))
    dataset = Path(next(o for o in over if o.startswith("data.dataset=")).split("=", 1)[1])
    test = DocumentDataset(dataset, "test")
    encode = TextEncoder(export, json.loads((export / "export.json").read_text()), None)
    same = []
    for i in range(len(test)):
        doc, sentences = test.source_doc(i), test.sentences_text(i)
        if test.chunk_index(i) != 0 or doc not in evaluated:
            continue
        texts, ids, _ = encode("\n\n".join(sentences), doc)
        if texts == sentences and all(np.array_equal(a, b) for a, b in zip(ids, test[i])):
            same.append((doc, "\n\n".join(sentences)))
    assert len(same) >= 2, (len(same), len(evaluated))
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": text}) + "\n" for _, text in same))
    out = run_hibert(["summarize", *over, "--model", "models:/hibert-abstractive@finetuned", "--input", docs,
                      "--json"], timeout=300)
    printed = [json.loads(line) for line in out.stdout.splitlines()]
    with mlflow_store(f"sqlite:///{root / 'mlflow.db'}", monkeypatch):
        model = mlflow.pyfunc.load_model("models:/hibert-abstractive@finetuned")
    served = model.predict(pd.DataFrame({"text": [text for _, text in same]}))
    for (doc, _), rec, summary, note in zip(same, printed, served["summary"], served["note"]):
        assert evaluated[doc] == rec["summary"] == list(summary), doc
        assert note.startswith("this model's decoder cannot write yet") and rec["note"] == note
    assert report["meta"]["notes"][0].startswith("this model's decoder cannot write yet")
