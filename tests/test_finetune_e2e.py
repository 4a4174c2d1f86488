"""`hibert finetune / evaluate / summarize` on the prepared CNN/DM sample (real DeepSpeed, MLflow, ROUGE)."""
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import HIBERT, run_hibert, tiny_train_overrides
from slurm_helpers import slurm_cluster  # noqa: F401  (fixture)
from test_pretrain_deepspeed import logged_by_step, metric_history

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def finetuned(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("ft")
    over = tiny_train_overrides(root, "ft", tiny_data["cnndm"], **{
        "schedule.max_steps": 24, "schedule.eval_every": 8, "checkpoint.keep_best": 2,
        "objective.top_k": 2, "optimizer.lr": 2e-3})
    run_hibert(["finetune", *over, "--init", "random", "--nproc", "2"], timeout=400)
    return root, over


def finetuned_dataset(finetuned) -> Path:
    _, over = finetuned
    return Path(next(o for o in over if o.startswith("data.dataset=")).split("=", 1)[1])


def test_head_trains_loss_falls_and_model_is_registered(finetuned):
    from hibert.registry import list_versions

    root, _ = finetuned
    losses = metric_history(root, "ft", "train_loss")
    assert np.mean(losses[-4:]) < np.mean(losses[:4]), losses
    assert metric_history(root, "ft", "valid_rouge")  # validation ROUGE drove model selection
    export = root / "ft" / "export"
    meta = json.loads((export / "export.json").read_text())
    assert meta["selection_metric"] == "valid_rouge" and 1 <= len(meta["selected_steps"]) <= 2
    # each exported step's own evaluation, as MLflow logged it at that step; the last evaluation kept apart
    logged = logged_by_step(root, "ft", "valid_rouge")
    assert sorted(int(s) for s in meta["selected_metrics"]) == sorted(meta["selected_steps"])
    for s, m in meta["selected_metrics"].items():
        assert m["valid_rouge"] == pytest.approx(logged[int(s)]), (s, logged)
    assert meta["final_metrics"]["valid_rouge"] == pytest.approx(logged[max(logged)])
    one = len(meta["selected_steps"]) == 1
    assert meta["metrics"] == (meta["selected_metrics"][str(meta["selected_steps"][0])] if one else {})
    assert meta["data"]["segmenter"]["kind"] == "spacy"
    assert (export / "head.safetensors").is_file() and (export / "tokenizer.model").is_file()
    # the export is the mean of the kept best evaluations' full fp32 weights (keep_best=2)
    from safetensors.torch import load_file

    kept = [load_file(str(root / "ft" / "best" / f"step_{s:09d}.safetensors")) for s in meta["selected_steps"]]
    head = load_file(str(export / "head.safetensors"))
    assert head and len(kept) == len(meta["selected_steps"])
    for name, value in head.items():
        assert torch.equal(value, sum(st[f"head.{name}"] for st in kept) / len(kept)), name
    versions = list_versions(f"sqlite:///{root / 'mlflow.db'}", "hibert-extractive")
    assert versions and versions[-1]["aliases"] == ["finetuned"]


def test_evaluate_reports_model_next_to_lead3_and_oracle(finetuned):
    root, over = finetuned
    out = run_hibert(["evaluate", *over, "--bootstrap", "200"], timeout=300)
    report = json.loads((root / "ft" / "report-test" / "report.json").read_text())
    # Lead-3, the oracle, Lead-k at the model's k and the training oracle's most frequent positions
    k = report["meta"]["k"]
    assert set(report["scores"]) == {"model", "lead3", "oracle", "position", *([f"lead{k}"] if k != 3 else [])}
    for system in report["scores"].values():
        r1 = system["rouge1_f"]
        assert r1["low"] <= r1["mean"] <= r1["high"]
    assert report["scores"]["oracle"]["rouge1_f"]["mean"] > report["scores"]["lead3"]["rouge1_f"]["mean"]
    # per-document scores (for paired comparisons later) and the paired model-vs-baseline differences
    per_doc = report["per_document"]
    assert len(per_doc["doc_ids"]) == report["num_documents"] == len(per_doc["model"]["rouge1_f"])
    assert np.mean(per_doc["lead3"]["rouge1_f"]) == pytest.approx(report["scores"]["lead3"]["rouge1_f"]["mean"],
                                                                  abs=1e-3)
    pair = report["paired"]["model-lead3"]["rouge1_f"]
    assert pair["low"] <= pair["diff"] <= pair["high"]
    assert pair["diff"] == pytest.approx(report["scores"]["model"]["rouge1_f"]["mean"]
                                         - report["scores"]["lead3"]["rouge1_f"]["mean"], abs=1e-6)
    assert (root / "ft" / "report-test" / "rouge.png").stat().st_size > 10_000
    md = (root / "ft" / "report-test" / "report.md").read_text()
    assert "| lead3 |" in md and "**reference:**" in md and "rouge-score" in md
    assert "ROUGE-1 reads |" in md and "One training seed of this model" in md   # no ordering read from one seed
    assert "lead3" in out.stdout and "report:" in out.stdout and "(paired: " in out.stdout


def test_summarize_raw_text_and_bad_input(finetuned, tmp_path):
    root, over = finetuned
    text = ("The city council approved the new budget on Monday. It includes money for three new schools. "
            "Critics said the plan raises taxes too much.\n\nThe mayor welcomed the vote. She said construction "
            "would start next year. Residents will be able to comment until March.")
    doc = tmp_path / "article.txt"
    doc.write_text(text)
    out = run_hibert(["summarize", *over, "--input", doc, "--k", "2", "--json"])
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rec["summary"]) == 2 and rec["indices"] == sorted(rec["indices"]) and rec["num_sentences"] == 6
    assert all(s in text for s in rec["summary"])
    one = subprocess.run(HIBERT + ["summarize", *over], input="Just one sentence here.", capture_output=True,
                         text=True, timeout=120)
    assert one.returncode == 0 and "Just one sentence here." in one.stdout
    # empty, binary and non-UTF-8 files: test_finetune_units.py; here the command's exit for one of them
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe bad")
    r = subprocess.run(HIBERT + ["summarize", *over, "--input", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not UTF-8" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(HIBERT + ["summarize", *over, "--model", str(tmp_path)], input="Some text.",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot load model" in r.stderr and "Traceback" not in r.stderr
    # input problems are found before the model loads: bad input and a bad model -> the input's error
    r = subprocess.run(HIBERT + ["summarize", *over, "--model", str(tmp_path), "--input", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not UTF-8" in r.stderr and "cannot load model" not in r.stderr


ABSTRACTIVE_FROZEN = {"finetune.task": "abstractive", "decoder.layers": 1, "finetune.max_target_tokens": 24,
                      "finetune.eval_decode_docs": 2, "generation.max_length": 8, "generation.beam_size": 1,
                      "schedule.max_steps": 2, "checkpoint.every_steps": 2, "optimizer.lr": 0.0}


def test_abstractive_starts_from_the_registered_extractive_model_under_zero1(finetuned):
    """PreSumm's BertSumExtAbs route: the abstractive head's encoder = the finetuned extractive encoder from
    the registry (2 ranks, ZeRO-1). The encoder is frozen the documented way, finetune.encoder_lr_scale=0
    (requires_grad is never toggled: it still gets gradients and optimizer state), while the decoder trains at
    optimizer.lr: the exported encoder must be the extractive one bit for bit, and the decoder must have moved."""
    from safetensors.torch import load_file

    root, _ = finetuned
    over = tiny_train_overrides(root, "abs-from-ext", finetuned_dataset(finetuned), **{
        **ABSTRACTIVE_FROZEN, "deepspeed.zero_stage": 1, "optimizer.lr": 2e-3, "finetune.encoder_lr_scale": 0.0,
        "finetune.encoder_warmup_steps": 0})
    out = run_hibert(["finetune", *over, "--init", "models:/hibert-extractive@finetuned", "--nproc", "2"],
                     timeout=400)
    assert re.search(r"ZeRO stage\s+1\n", out.stderr) and re.search(r"world size\s+2 ", out.stderr), out.stderr[-3000:]
    extractive = load_file(str(root / "ft" / "export" / "encoder.safetensors"))
    exported = load_file(str(root / "abs-from-ext" / "export" / "encoder.safetensors"))
    assert extractive.keys() == exported.keys()
    assert all(np.array_equal(extractive[k].numpy(), exported[k].numpy()) for k in extractive)
    # the decoder trained: its LayerNorms start at exactly 1 (weight) / 0 (bias) and its Linear biases at 0
    # (modeling.layers.init_weights); after two Adam steps at lr 2e-3 every one of them has moved
    decoder = load_file(str(root / "abs-from-ext" / "export" / "decoder.safetensors"))
    fresh = {k: (1.0 if k.endswith("norm.weight") else 0.0) for k in decoder
             if k.endswith(("norm.weight", "norm.bias")) or (k.endswith(".bias") and decoder[k].ndim == 1)}
    assert len(fresh) >= 8, sorted(decoder)
    unmoved = [k for k, init in fresh.items() if (decoder[k] == init).all()]
    assert not unmoved, unmoved
    meta = json.loads((root / "abs-from-ext" / "export" / "export.json").read_text())
    assert meta["task"] == "abstractive" and "hibert-extractive" in json.dumps(meta.get("init"))


def test_abstractive_decoder_starts_from_the_pretraining_decoder(finetuned, tmp_path):
    """finetune.init_decoder=true: the decoder's self-attention/FFN come from a pretraining export's
    masked-sentence decoder (written here from a HibertForPretraining of the run's size and vocabulary)."""
    import torch
    from safetensors.torch import load_file, save_file

    from hibert.config.model import ModelConfig
    from hibert.modeling.pretraining import HibertForPretraining
    from hibert.runtime.export import write_export

    root, _ = finetuned
    dataset = finetuned_dataset(finetuned)
    model_cfg = ModelConfig.model_validate(json.loads((root / "ft" / "export" / "model.json").read_text()))
    torch.manual_seed(3)
    pre = HibertForPretraining(model_cfg)
    state = pre.state_dict()
    export = write_export(tmp_path / "pretrained", {k[8:]: v for k, v in state.items() if k.startswith("encoder.")},
                          model_cfg, dataset / "tokenizer.model", {"task": "pretrain"})
    dec = {k[8:]: v.contiguous() for k, v in state.items() if k.startswith("decoder.")}
    save_file(dec, str(export / "decoder.safetensors"))
    over = tiny_train_overrides(tmp_path, "abs-dec", dataset, **{
        **ABSTRACTIVE_FROZEN, "decoder.layers": 2, "finetune.init_decoder": True, "deepspeed.zero_stage": 0})
    run_hibert(["finetune", *over, "--init", export], timeout=300)
    got = load_file(str(tmp_path / "abs-dec" / "export" / "decoder.safetensors"))
    loaded = 0
    for name, value in dec.items():   # pretraining names: layers.layers.<i>.* -> decoder.layers.<i>.*
        target = "decoder." + name.replace("layers.layers.", "layers.", 1).replace("layers.final_norm.",
                                                                                   "final_norm.", 1)
        if target in got and got[target].shape == value.shape:
            assert torch.equal(got[target], value), target
            loaded += 1
    assert loaded >= 8, sorted(got)[:20]   # both layers' self-attention and FFN at least
    # the cross-attention has no pretraining counterpart: it keeps its fresh initialisation
    assert any(".cross." in k for k in got)


def _damage(export: Path, dst: Path, how: str) -> Path:
    import shutil

    shutil.copytree(export, dst)
    if how == "truncated encoder":
        (dst / "encoder.safetensors").write_bytes((export / "encoder.safetensors").read_bytes()[:1000])
    elif how == "truncated head":
        (dst / "head.safetensors").write_bytes(b"\x10\x00")
    elif how == "no tokenizer":
        (dst / "tokenizer.model").unlink()
    elif how == "random tokenizer":
        (dst / "tokenizer.model").write_bytes(np.random.default_rng(0).bytes(3000))
    elif how == "export.json list":
        (dst / "export.json").write_text("[1, 2]")
    elif how == "model.json garbage":
        (dst / "model.json").write_text("{")
    return dst


DAMAGE = [("truncated encoder", "encoder.safetensors is damaged or not a safetensors file"),
          ("truncated head", "head.safetensors is damaged or not a safetensors file"),
          ("no tokenizer", "tokenizer.model is missing"),
          ("random tokenizer", "tokenizer.model is not the tokenizer this model was trained with"),
          ("export.json list", "export.json holds a JSON list, not an object"),
          ("model.json garbage", "model.json is unreadable or not JSON")]


def test_damaged_exports_and_unresolvable_references_are_one_line(finetuned, tmp_path, capsys, monkeypatch):
    """Each damaged part of an export, and every malformed or missing models:/ reference: one line naming the
    file or the reference, exit 2 (summarize) / 1-2 (evaluate), no traceback, nothing written where the user
    did not ask (no registry created by looking one up)."""
    from hibert.cli import main

    root, over = finetuned
    export = root / "ft" / "export"
    assert (export / "head.safetensors").is_file()
    doc = tmp_path / "doc.txt"
    doc.write_text("The council met on Monday. It approved the budget. Critics said taxes rise.")
    for how, needle in DAMAGE:
        bad = _damage(export, tmp_path / how.replace(" ", "-"), how)
        assert main(["summarize", *over, "--model", str(bad), "--input", str(doc)]) == 2, how
        err = capsys.readouterr().err
        assert needle in err and str(bad) in err and "Traceback" not in err, (how, err)
    bad = tmp_path / "truncated-encoder"
    assert main(["evaluate", *over, "--model", str(bad), "--split", "valid", "--out", str(tmp_path / "r")]) != 0
    assert "encoder.safetensors is damaged" in capsys.readouterr().err
    # references, from an empty directory with the default store: nothing is created there
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for ref, needle in [("models:/", "write models:/<name>@<alias>"), ("models:/x@", "write models:/<name>@<alias>"),
                        ("models:/x/abc", "<version number>"), ("models:/hibert-extractive@nope", "no registry at")]:
        assert main(["summarize", "--model", ref, "--input", str(doc)]) == 2, ref
        err = capsys.readouterr().err
        assert needle in err and ref in err and "Traceback" not in err, (ref, err)
    assert list(empty.iterdir()) == []
    # in a store that exists: a missing alias, version or model names the reference and the store
    store = [o for o in over if o.startswith("run.output_dir=")]
    for ref in ("models:/hibert-extractive@nope", "models:/hibert-extractive/99", "models:/no-such-model@finetuned"):
        assert main(["summarize", *store, "--model", ref, "--input", str(doc)]) == 2, ref
        err = capsys.readouterr().err
        assert "does not resolve in sqlite:///" in err and ref in err and "Traceback" not in err, (ref, err)
        assert main(["evaluate", *over, "--model", ref, "--split", "valid"]) == 2, ref
        assert "does not resolve" in capsys.readouterr().err


def test_pyfunc_predict_picks_what_summarize_picks(finetuned, monkeypatch):
    """The registered extractive version as an MLflow pyfunc model: `k` as a param, the same picks as
    `hibert summarize --k`, and k=0 refused with a message."""
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    root, over = finetuned
    texts = ["The city council approved the new budget on Monday. It includes money for three new schools. "
             "Critics said the plan raises taxes too much. The mayor welcomed the vote.",
             "Rain fell for a week. Rivers rose. Two bridges closed on Friday. Officials urged calm."]
    docs = root / "pyfunc_docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = run_hibert(["summarize", *over, "--model", "models:/hibert-extractive@finetuned", "--input", docs,
                      "--k", "2", "--json"])
    want = [(r["summary"], r["indices"]) for r in map(json.loads, out.stdout.splitlines())]
    from serving_helpers import mlflow_store

    with mlflow_store(f"sqlite:///{root / 'mlflow.db'}", monkeypatch):
        model = mlflow.pyfunc.load_model("models:/hibert-extractive@finetuned")
    got = model.predict(pd.DataFrame({"text": texts}), params={"k": 2})
    assert list(zip(got["summary"], got["indices"])) == want
    with pytest.raises(MlflowException, match="params.k 0: must be >= 1"):
        model.predict(pd.DataFrame({"text": texts}), params={"k": 0})


def test_the_served_model_is_the_evaluated_one(finetuned, tmp_path, monkeypatch):
    """k and trigram blocking are tuned on validation at export (extractive.json + selection_tuning.json), and
    that one selection is what `hibert evaluate` scores, `hibert summarize` prints and the pyfunc model serves:
    the same sentences picked on the same test documents, with no flags or params given. The registered version
    records it (tags, description)."""
    import mlflow
    import pandas as pd

    from hibert.data_prep import DocumentDataset
    from hibert.finetune.evaluation.report import documents
    from hibert.finetune.inference.text import TextEncoder
    from hibert.registry import client
    from serving_helpers import mlflow_store

    root, over = finetuned
    export = root / "ft" / "export"
    selection = json.loads((export / "extractive.json").read_text())
    tuning = json.loads((export / "selection_tuning.json").read_text())
    assert tuning["tuned"] and tuning["documents"] > 0 and len(tuning["grid"]) == 10
    best = max(tuning["grid"], key=lambda g: g["rouge"])
    assert selection == {"top_k": best["k"], "trigram_blocking": best["trigram_blocking"]} != {}
    assert tuning["configured"] == {"top_k": 2, "trigram_blocking": False}
    prior = tuning["train_oracle_positions"]
    assert prior["documents"] > 0 and sum(prior["counts"]) >= prior["documents"]
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mv = client(uri).get_model_version_by_alias("hibert-extractive", "finetuned")
    assert mv.tags["top_k"] == str(selection["top_k"]) and "the model's own (extractive.json), tuned" in mv.description
    assert "selected by valid_rouge" in mv.description

    out = tmp_path / "report"
    run_hibert(["evaluate", *over, "--bootstrap", "20", "--out", out], timeout=300)
    report = json.loads((out / "report.json").read_text())
    assert (report["meta"]["k"], report["meta"]["trigram_blocking"]) == (selection["top_k"],
                                                                         selection["trigram_blocking"])
    assert "served model use the same" in report["meta"]["notes"][-1]
    docs = documents(DocumentDataset(finetuned_dataset(finetuned), "test"))
    picks = dict(zip([d.doc_id for d in docs], report["picks"]["model"]))
    # the documents whose text `summarize` segments into the evaluated sentences (the same segmenter as prep;
    # a sentence per paragraph, as the prepared text is tokenized and would not always split the same again)
    encode = TextEncoder(export, json.loads((export / "export.json").read_text()), None)
    same = [d for d in docs if encode("\n\n".join(d.sentences), d.doc_id)[0] == d.sentences]
    assert len(same) >= 3, (len(same), len(docs))
    inputs = tmp_path / "test_docs.jsonl"
    inputs.write_text("".join(json.dumps({"id": d.doc_id, "text": "\n\n".join(d.sentences)}) + "\n" for d in same))
    # a registered model is downloaded once into the user's model cache, quietly, and nothing lands in the cwd
    cwd, cache = tmp_path / "cwd", tmp_path / "cache"
    cwd.mkdir()
    env = {**os.environ, "HIBERT_CACHE": str(cache)}
    for _ in range(2):
        printed = run_hibert(["summarize", *over, "--model", "models:/hibert-extractive@finetuned", "--input", inputs,
                              "--json"], cwd=cwd, env=env)
        assert "Downloading artifacts" not in printed.stderr
    assert list(cwd.iterdir()) == [] and len(list(cache.glob("models/*/hibert-extractive/*"))) == 1
    summarized = dict(zip([d.doc_id for d in same], [r["indices"] for r in map(json.loads, printed.stdout.splitlines())]))
    with mlflow_store(uri, monkeypatch):
        model = mlflow.pyfunc.load_model("models:/hibert-extractive@finetuned")
    got = model.predict(pd.DataFrame({"id": [d.doc_id for d in same], "text": ["\n\n".join(d.sentences) for d in same]}))
    served = dict(zip([d.doc_id for d in same], [list(map(int, i)) for i in got["indices"]]))
    assert len(summarized) == len(served) == len(same) and list(got["id"]) == [d.doc_id for d in same]
    for d in same:
        assert picks[d.doc_id] == summarized[d.doc_id] == served[d.doc_id], d.doc_id


def test_served_extractive_model_refuses_what_the_cli_refuses_with_our_message(finetuned, tmp_path):
    """`mlflow models serve` of the extractive version: the same params, bounds and refusals as every head —
    another head's params (beam, batch_size) are a 400 saying they do not apply, k=0 is out of bounds — and the
    400's body is our message, not MLflow's dump of the request."""
    from serving_helpers import invoke, served

    root, _ = finetuned
    rows = {"dataframe_records": [{"id": "a", "text": "Rain fell for a week. Rivers rose. Two bridges closed."}]}
    with served("models:/hibert-extractive@finetuned", f"sqlite:///{root / 'mlflow.db'}", tmp_path / "serve.log") as url:
        status, body = invoke(url, {**rows, "params": {"k": 2}})
        assert status == 200 and len(body["predictions"][0]["summary"]) == 2, body
        for params, says in (({"beam": -1}, "params.beam: does not apply to an extractive model (its params: "
                                             "params.k)"),
                             ({"batch_size": 20}, "params.batch_size: does not apply to an extractive model"),
                             ({"k": 0}, "params.k 0: must be >= 1")):
            status, body = invoke(url, {**rows, "params": params})
            assert status == 400 and body["message"].startswith(says), (params, body)
            assert "Failed to predict" not in body["message"] and "Rain fell" not in body["message"]


def test_hibert_serve_answers_malformed_requests_in_one_line_and_bounds_the_body(finetuned, tmp_path):
    """`hibert serve`: MLflow's scoring server behind a guard. A param of the wrong type, no rows, JSON that does not
    parse or is 100,000 deep are a 400 naming what is wrong (never MLflow's "Failed to predict data", an echo of the
    body, or a 500); a body above --max-body-mb is a 413; a good request is answered as `mlflow models serve` does."""
    from serving_helpers import invoke, served

    root, _ = finetuned
    rows = {"dataframe_records": [{"id": "a", "text": "Rain fell for a week. Rivers rose. Two bridges closed."}]}
    with served("models:/hibert-extractive@finetuned", f"sqlite:///{root / 'mlflow.db'}", tmp_path / "serve.log",
                hibert=True, extra=("--max-body-mb", "1")) as url:
        status, body = invoke(url, {**rows, "params": {"k": 2}})
        assert status == 200 and len(body["predictions"][0]["summary"]) == 2, body
        bad = [({**rows, "params": {"k": "abc"}}, 'params.k "abc": must be an integer'),
               ({**rows, "params": {"k": 2.5}}, "params.k 2.5: must be an integer"),
               ({**rows, "params": {"k": True}}, "params.k true: must be an integer"),
               ({**rows, "params": {"k": [1, 2]}}, "params.k [1, 2]: must be an integer"),
               ({**rows, "params": {"k": 0}}, "params.k 0: must be >= 1"),        # the pyfunc's own bound, behind it
               ({"dataframe_records": []}, "dataframe_records is empty"),
               (b'{"dataframe_records": [{"text": "Rain fell."' + b" " * 500_000, "the request is not JSON"),
               (b"[" * 100_000 + b"]" * 100_000, "the request's JSON is nested too deep")]
        for payload, says in bad:
            status, body = invoke(url, payload)
            assert status == 400 and body["message"].startswith(says), (says, status, str(body)[:300])
            assert "Failed to predict" not in body["message"] and len(body["message"]) < 300, body
        status, body = invoke(url, b'{"dataframe_records": "' + b"x" * (2 * 2**20) + b'"}')
        assert status == 413 and "at most 1,048,576" in body["message"], str(body)[:300]
        status, body = invoke(url, {**rows, "params": {"k": 1}})   # and it keeps answering
        assert status == 200 and len(body["predictions"][0]["summary"]) == 1, body


def test_summarize_a_corpus_streams_resumes_after_kill9_and_splits_over_processes(finetuned, tmp_path):
    """`hibert summarize --output` on a JSONL corpus with bad records (one output line each, counted), killed
    -9 mid-run with a line cut in a part file, resumed: byte-identical to the uninterrupted output, in input
    order, nothing twice, from 2 local processes; the same summaries from a saved `datasets` dataset."""
    import os
    import signal
    import time

    from conftest import REPO

    root, over = finetuned
    rows = [json.loads(line) for line in (REPO / "samples" / "cnndm_train_sample.jsonl").read_text().splitlines()[:30]]
    lines = [json.dumps({"id": f"d{i}", "text": r["article"]}) for i, r in enumerate(rows)]
    lines[5:5] = ["{not json", json.dumps({"id": "empty", "text": " "}), ""]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    base = ["summarize", *over, "--input", corpus, "--k", "2", "--no-progress"]

    ref = tmp_path / "ref.jsonl"
    out = run_hibert([*base, "--output", ref], timeout=300)
    assert "32 records in: 30 summarized + 2 skipped (empty 1, invalid JSON 1)" in out.stdout
    recs = [json.loads(line) for line in ref.read_text().splitlines()]
    assert [r["index"] for r in recs] == sorted(r["index"] for r in recs) and len(recs) == 32
    assert recs[5]["reason"] == "invalid JSON" and "corpus.jsonl:6" in recs[5]["skipped"]
    assert all(len(r["summary"]) == 2 for r in recs if "skipped" not in r)

    killed = tmp_path / "killed.jsonl"
    args = HIBERT + [str(a) for a in [*base, "--output", killed, "--nproc", "2", "--window", "2"]]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    part0 = tmp_path / "killed.jsonl.part-00000-of-00002"
    deadline = time.time() + 120
    while not (part0.is_file() and part0.read_text().count("\n") >= 4) and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not killed.exists()
    with open(part0, "a") as f:   # as if the crash had cut a line in half
        f.write('{"index": 99, "id": "d9')
    out = run_hibert([*base, "--output", killed, "--nproc", "2", "--window", "2"], timeout=300)
    assert killed.read_bytes() == ref.read_bytes()
    assert not list(tmp_path.glob("killed.jsonl.part-*"))      # parts removed after the merge

    again = run_hibert([*base, "--output", killed], timeout=120)
    assert again.stdout.startswith("already complete: 32 records in")
    # the finished output asked for with another setting is refused, not passed off as done
    other = run_hibert([*base, "--output", killed, "--k", "1"], check=False, timeout=120)
    assert other.returncode == 2 and "is complete, made with other settings or input" in other.stderr, other.stderr
    # --shard I/N + --merge (what a Slurm array does): test_summarize_a_corpus_as_a_slurm_array_then_merge

    from datasets import Dataset

    good = [json.loads(line) for line in lines if line.strip().startswith('{"id": "d')]
    Dataset.from_list(good).save_to_disk(str(tmp_path / "ds"))
    from_ds = tmp_path / "from_ds.jsonl"
    run_hibert(["summarize", *over, "--input", tmp_path / "ds", "--k", "2", "--no-progress", "--output", from_ds],
               timeout=300)
    want = [(r["id"], r["summary"]) for r in recs if "skipped" not in r]
    assert [(r["id"], r["summary"]) for r in map(json.loads, from_ds.read_text().splitlines())] == want


@pytest.mark.slurm
@pytest.mark.timeout(400)
def test_summarize_a_corpus_as_a_slurm_array_then_merge(finetuned, slurm_cluster, tmp_path):  # noqa: F811
    """`hibert submit` of a summarize stage (a 2-task array, one shard per node of the local cluster) and its
    summarize-merge stage: the merged output is byte-identical to a one-process run."""
    import yaml

    from conftest import REPO
    from hibert.cli import main

    root, over = finetuned
    rows = [json.loads(line) for line in (REPO / "samples" / "cnndm_test_sample.jsonl").read_text().splitlines()[:9]]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"t{i}", "text": r["article"]}) + "\n" for i, r in enumerate(rows))
                      + "{cut\n")
    export = root / "ft" / "export"
    flags = ["--model", str(export), "--input", str(corpus), "--k", "2"]
    ref = tmp_path / "ref.jsonl"
    run_hibert(["summarize", *over, *flags, "--output", ref, "--no-progress"], timeout=300)
    out = tmp_path / "out.jsonl"
    recipe = tmp_path / "corpus.yaml"
    recipe.write_text(yaml.safe_dump({"run": {"name": "corp", "output_dir": str(tmp_path / "runs")},
                                      "model": "hibert_tiny", "slurm": {
        "gpus_per_node": 0, "ntasks_per_node": 1, "cpus_per_task": 1, "time": "00:05:00", "summarize_shards": 2,
        "pipeline": [{"name": "sum", "command": "summarize", "args": [*flags, "--output", str(out)]},
                     {"name": "sum-merge", "command": "summarize-merge",
                      "args": ["--input", str(corpus), "--output", str(out)]}]}}))
    assert main(["submit", str(recipe), "--out-dir", str(tmp_path / "slurm")]) == 0
    ids = json.loads((tmp_path / "slurm" / "jobs.json").read_text())["jobs"]
    slurm_cluster.track(list(ids.values()))
    slurm_cluster.wait_done(ids["sum-merge"], timeout=300)
    assert set(slurm_cluster.states(ids["sum"])) == {"COMPLETED"}, slurm_cluster.show(ids["sum"])
    assert set(slurm_cluster.states(ids["sum-merge"])) == {"COMPLETED"}
    assert out.read_bytes() == ref.read_bytes()
    assert json.loads((tmp_path / "out.jsonl.stats.json").read_text())["skipped"] == {"invalid JSON": 1}


def test_an_early_stopped_run_started_again_trains_no_further(tiny_data, tmp_path):
    """A requeue of a run that stopped early (e.g. exit 69 while the tracking server was away) used to train on
    past its stop and publish again: the stop is part of the run's state, so it is 'already finished'."""
    over = tiny_train_overrides(tmp_path, "es", tiny_data["cnndm"], **{
        "schedule.max_steps": 40, "schedule.eval_every": 2, "schedule.early_stop_patience": 1,
        "optimizer.lr": 1e-12})   # the weights do not move: the second evaluation cannot improve on the first
    run_hibert(["finetune", *over, "--init", "random"], timeout=300)
    meta = json.loads((tmp_path / "es" / "export" / "export.json").read_text())
    again = run_hibert(["finetune", *over, "--init", "random"], timeout=300)
    assert "run already finished at step 4" in again.stdout + again.stderr
    assert json.loads((tmp_path / "es" / "export" / "export.json").read_text()) == meta


def test_evaluate_refuses_an_out_file_and_a_report_directory_another_evaluation_holds(finetuned, tmp_path):
    """`--out <a file>` was a FileExistsError traceback after the scoring ran; two evaluations of one run at once
    (another --k) logged one's scores with the other's report: both are refused before any work."""
    from filelock import FileLock

    _, over = finetuned
    f = tmp_path / "a.txt"
    f.write_text("x")
    r = run_hibert(["evaluate", *over, "--out", str(f)], check=False, timeout=120)
    assert r.returncode == 2 and "is a file; name a directory" in r.stderr and f.read_text() == "x", r.stderr
    out = tmp_path / "rep"
    with FileLock(str(tmp_path / ".rep.lock")):   # another evaluation writing this report directory
        r = run_hibert(["evaluate", *over, "--out", str(out), "--k", "2"], check=False, timeout=120)
    assert r.returncode == 2 and "another hibert evaluate is writing" in r.stderr and not out.exists(), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
