"""`hibert export-hf` for real: an encoder from a real `hibert pretrain` run (and an extractive model from a real
`hibert finetune` run) written as a Hugging Face folder, loaded in a FRESH virtualenv that holds only torch,
transformers, safetensors and sentencepiece (the project is not importable there), and compared with the project's
own encoder, tokenizer and extractive scores on the same documents: fp32, max abs diff <= 1e-5.

The fresh virtualenv is built once and cached (HIBERT_HF_VENV, else ~/.cache/hibert/hf-venv/<python-torch-packages
key>; HIBERT_HF_TRANSFORMERS picks another transformers release):
the first run installs torch (this machine's CPU wheel, pinned to the project's torch), then transformers,
safetensors and sentencepiece from the package index; the tests skip, saying why, where that cannot be done."""
from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, run_hibert, tiny_train_overrides

TOLERANCE = 1e-5
PIP_TIMEOUT = 2400   # one pip step of the first run (torch's wheel is ~200 MB; a loaded machine unpacks slowly)
FIRST = 4800         # the first test's limit: it builds the virtualenv (first run only) and both exports
# another transformers release for the fresh virtualenv (its own cached one), e.g.
# HIBERT_HF_TRANSFORMERS=transformers==4.46.3
HF_PACKAGES = [os.environ.get("HIBERT_HF_TRANSFORMERS", "transformers"), "safetensors", "sentencepiece"]
HF_FILES = {"config.json", "model.safetensors", "configuration_hibert.py", "modeling_hibert.py",
            "tokenization_hibert.py", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
            "hibert_export.json", "README.md"}


# ---------------------------------------------------------------- the fresh virtualenv (cached)
def _torch_pin() -> str:
    """The project's own torch, local label included (2.13.0+cpu: only a CPU wheel matches, never a CUDA one)."""
    import torch

    return torch.__version__


def _venv_dir() -> Path:
    if os.environ.get("HIBERT_HF_VENV"):
        return Path(os.environ["HIBERT_HF_VENV"])
    key = f"py{sys.version_info[0]}{sys.version_info[1]}-torch{_torch_pin()}-" + \
        hashlib.sha256(" ".join(HF_PACKAGES).encode()).hexdigest()[:8]
    return Path.home() / ".cache" / "hibert" / "hf-venv" / key


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a process in the fresh virtualenv: no PYTHONPATH, no virtualenv of the project's."""
    keep = {k: v for k, v in os.environ.items()
            if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") or k.startswith("PIP_")}
    keep["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    return {**keep, **extra}


def _pip(python: Path, args: list[str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout,
                          env=_clean_env(), cwd=tempfile.gettempdir())


def _usable(python: Path) -> str | None:
    """The versions the virtualenv holds, or None when it cannot import what the tests need."""
    probe = ("import torch, transformers, safetensors, sentencepiece, importlib.util; "
             "assert importlib.util.find_spec('hibert') is None, 'hibert is importable'; "
             "print(f'torch {torch.__version__}, transformers {transformers.__version__}, '"
             "f'safetensors {safetensors.__version__}, sentencepiece {sentencepiece.__version__}')")
    if not python.is_file():
        return None
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300,
                         env=_clean_env(), cwd=tempfile.gettempdir())
    return out.stdout.strip() if out.returncode == 0 else None


def _build_venv(place: Path) -> Path:
    """python -m venv, torch first (pinned to the project's build: this machine's local CPU wheel, never CUDA's),
    then the rest; built beside its place and renamed into it (a killed build leaves no half environment)."""
    partial = place.with_name(f"{place.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    steps = [["install", "-q", f"torch=={_torch_pin()}"],
             ["install", "-q", *HF_PACKAGES, f"torch=={_torch_pin()}"]]   # torch stays the one installed
    try:
        subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True, capture_output=True, timeout=300)
        for step in steps:
            try:
                out = _pip(partial / "bin" / "python", step, timeout=PIP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.skip(f"installing {' '.join(step[2:])} into a fresh virtualenv took over {PIP_TIMEOUT} s "
                            "(a slow or unreachable package index)")
            if out.returncode != 0:
                pytest.skip(f"cannot install {' '.join(step[2:])} into a fresh virtualenv: "
                            f"{(out.stderr or out.stdout).strip().splitlines()[-1:]}")
        shutil.rmtree(place, ignore_errors=True)
        partial.rename(place)
    finally:
        shutil.rmtree(partial, ignore_errors=True)   # what a failed or skipped build left
    return place / "bin" / "python"


@pytest.fixture(scope="session")
def hf_python() -> tuple[Path, str]:
    """(python of the fresh virtualenv, its package versions); skipped where transformers cannot be installed."""
    from filelock import FileLock

    place = _venv_dir()
    place.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(place) + ".lock", timeout=1800):   # one build at a time, whoever asks
        python = place / "bin" / "python"
        versions = _usable(python)
        if versions is None:
            with tempfile.TemporaryDirectory() as d:   # the package index reachable? (no network: skip, say so)
                probe = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--retries", "1",
                                        "--timeout", "30", "-d", d, HF_PACKAGES[0]], capture_output=True, text=True,
                                       timeout=300, env=_clean_env())
            if probe.returncode != 0:
                pytest.skip("transformers cannot be installed here (the package index is unreachable: "
                            f"{(probe.stderr or probe.stdout).strip().splitlines()[-1:]})")
            python = _build_venv(place)
            versions = _usable(python)
            assert versions is not None, f"the fresh virtualenv at {place} does not import its packages"
    return python, versions


# ---------------------------------------------------------------- real exports
@pytest.fixture(scope="module")
def exports(tiny_data, tmp_path_factory) -> dict[str, Path | str]:
    """A 4-step open-domain pretraining on one process (registered: models:/hibert-encoder@open-domain), and a
    4-step extractive finetuning from it."""
    root = tmp_path_factory.mktemp("hfx")
    short = {"schedule.max_steps": 4, "checkpoint.every_steps": 0}
    run_hibert(["pretrain", *tiny_train_overrides(root, "pre", tiny_data["open"], **short), "--stage", "open-domain"],
               timeout=400)
    run_hibert(["finetune", *tiny_train_overrides(root, "ext", tiny_data["cnndm"], **short),
                "--init", root / "pre" / "export"], timeout=400)
    return {"root": root, "uri": f"sqlite:///{root / 'mlflow.db'}", "encoder": root / "pre" / "export",
            "extractive": root / "ext" / "export", "prenorm": _prenorm_export(root / "prenorm", tiny_data)}


def _prenorm_export(out: Path, tiny_data) -> Path:
    """The layers' other options, which the tiny runs do not take: pre-LN (a final LayerNorm per stack), GELU, an FFN
    width of its own, 3 heads; random weights (LayerNorms included) written as an export with the runs' tokenizer."""
    import torch

    from hibert.config.model import ModelConfig
    from hibert.modeling import HibertEncoder
    from hibert.runtime.export import write_export

    tokenizer = tiny_data["open"] / "tokenizer.model"
    cfg = ModelConfig(name="prenorm_gelu", vocab_size=600, hidden=48, layers=2, heads=3, ffn=100, dropout=0.0,
                      max_positions=64, norm_first=True, activation="gelu")
    torch.manual_seed(0)
    enc = HibertEncoder(cfg)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    meta = {"task": "masked_sentence", "stage": "synthetic", "step": 1, "git_commit": "unknown"}
    return write_export(out, enc.state_dict(), cfg, tokenizer, meta)


def _documents(tiny_data) -> dict[str, list[str]]:
    """Raw texts: CNN/DM test articles (PTB-tokenized, many over 30 sentences) and Reuters bodies (plain text)."""
    def first(name: str, field: str) -> list[str]:
        return [json.loads(line)[field] for line in (REPO / "samples" / name).read_text().splitlines()[:6]]

    cnn, reuters = first("cnndm_test_sample.jsonl", "article"), first("reuters_sample.jsonl", "body")
    return {"ptb": cnn, "plain": [r for r in reuters if r.strip()][:5]}


HF_SCRIPT = r'''
import importlib.util, json, sys, time
t0 = time.time()
assert importlib.util.find_spec("hibert") is None, "the project is importable in the clean environment"
import torch, transformers
from safetensors.torch import save_file
from transformers import AutoModel, AutoModelForTokenClassification, AutoTokenizer

jobs = json.load(open(sys.argv[1]))
for job in jobs:
    tok = AutoTokenizer.from_pretrained(job["folder"], trust_remote_code=True)
    model = AutoModel.from_pretrained(job["folder"], trust_remote_code=True).eval()
    ext = AutoModelForTokenClassification.from_pretrained(job["folder"], trust_remote_code=True).eval() \
        if job["head"] else None
    tensors, info = {}, {"tokenizer": type(tok).__name__, "model": type(model).__name__,
                         "head": type(ext).__name__ if ext is not None else None, "batches": {}}
    for name, docs in job["inputs"].items():
        batch = tok(docs, return_tensors="pt", return_sentences=True)
        info["batches"][name] = {"sentences": batch.pop("sentences")}
        with torch.no_grad():
            out = model(**batch)
            for k in ("input_ids", "attention_mask", "sentence_mask", "document_index"):
                tensors[f"{name}.{k}"] = batch[k].contiguous()
            tensors[f"{name}.states"] = out.last_hidden_state.contiguous()
            tensors[f"{name}.vectors"] = out.sentence_vectors.contiguous()
            tensors[f"{name}.tokens"] = out.token_states.contiguous()
            if ext is not None:
                got = ext(**batch)
                tensors[f"{name}.scores"] = got.scores.contiguous()
                tensors[f"{name}.logits"] = got.logits.contiguous()
                tensors[f"{name}.head_states"] = got.last_hidden_state.contiguous()
    save_file(tensors, job["out"])
    json.dump(info, open(job["out"] + ".json", "w"))
print(f"transformers {transformers.__version__}: {len(jobs)} folder(s) in {time.time() - t0:.1f}s")
'''


@pytest.fixture(scope="module")
def hf_run(hf_python, exports, tiny_data, tmp_path_factory):
    """The exports written by `hibert export-hf` (the trained encoder through its models:/ reference), then loaded
    and run in the fresh virtualenv from a temporary directory with a clean environment."""
    python, versions = hf_python
    work = tmp_path_factory.mktemp("hf")
    folders = {k: work / f"hf-{k}" for k in ("encoder", "extractive", "prenorm")}
    t0 = time.time()
    out = run_hibert(["export-hf", "models:/hibert-encoder@open-domain", folders["encoder"], "--uri", exports["uri"]],
                     timeout=300)
    assert "HibertModel" in out.stdout and "huggingface-cli upload" in out.stdout, out.stdout
    out = run_hibert(["export-hf", exports["extractive"], folders["extractive"]], timeout=300)
    assert "HibertForSentenceLabelling" in out.stdout, out.stdout
    run_hibert(["export-hf", exports["prenorm"], folders["prenorm"]], timeout=300)
    export_s = time.time() - t0

    docs = _documents(tiny_data)
    split = {k: _project_sentences(exports[k], docs["plain"])[0] for k in folders}
    jobs = [{"folder": str(folders[k]), "head": k == "extractive", "out": str(work / f"{k}.safetensors"),
             "inputs": {"ptb": docs["ptb"], "plain": docs["plain"], "split": split[k]}} for k in folders]
    (work / "jobs.json").write_text(json.dumps(jobs))
    (work / "run_hf.py").write_text(HF_SCRIPT)
    cwd = Path(tempfile.mkdtemp(prefix="hf-clean-", dir=work))   # nowhere near the project
    t0 = time.time()
    ran = subprocess.run([str(python), str(work / "run_hf.py"), str(work / "jobs.json")], cwd=cwd, capture_output=True,
                         text=True, timeout=600,
                         env=_clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(work / "hf-home")))
    assert ran.returncode == 0, f"--- stdout\n{ran.stdout[-3000:]}\n--- stderr\n{ran.stderr[-6000:]}"
    from safetensors.torch import load_file

    results = {k: (load_file(j["out"]), json.loads(Path(j["out"] + ".json").read_text()))
               for k, j in zip(folders, jobs)}
    print(f"\n[hf-export] fresh env: {versions}; export-hf x3 {export_s:.1f}s, HF load+run {time.time() - t0:.1f}s "
          f"({ran.stdout.strip()})")
    return {"folders": folders, "docs": docs, "split": split, "results": results, "stderr": ran.stderr}


# ---------------------------------------------------------------- the project's side
def _project_sentences(export_dir: Path, texts: list[str]) -> tuple[list[list[str]], list[list[list[int]]]]:
    """The project's inference input (finetune/inference/text.py TextEncoder): per text, its sentence texts and
    their subword ids (cut to max_sentence_tokens, empty ones dropped)."""
    from hibert.finetune.inference.text import TextEncoder
    from hibert.json_files import read_json_object

    enc = TextEncoder(Path(export_dir), read_json_object(Path(export_dir) / "export.json"))
    got = [enc(t) for t in texts]
    return [list(s) for s, _, _ in got], [[x.tolist() for x in ids] for _, ids, _ in got]


def _chunks(ids: list[list[list[int]]], step: int) -> tuple[list[list[list[int]]], list[int]]:
    """Documents cut into chunks of `step` sentences, as the project's extractive summarizer scores them."""
    rows, index = [], []
    for d, doc in enumerate(ids):
        for a in range(0, max(len(doc), 1), step):
            rows.append(doc[a:a + step])
            index.append(d)
    return rows, index


def _rows(t: dict, name: str) -> list[list[list[int]]]:
    """The HF tokenizer's rows as documents of sentences of word ids (EOS checked and removed)."""
    ids, mask, sent = t[f"{name}.input_ids"], t[f"{name}.attention_mask"].bool(), t[f"{name}.sentence_mask"].bool()
    out = []
    for b in range(ids.shape[0]):
        doc = []
        for j in range(ids.shape[1]):
            if not sent[b, j]:
                assert not mask[b, j].any()
                continue
            row = ids[b, j][mask[b, j]].tolist()
            assert row[-1] == 3 and 3 not in row[:-1], row   # words, then EOS
            doc.append(row[:-1])
        out.append(doc)
    return out


def _encoder(export_dir: Path):
    from hibert.modeling import HibertEncoder
    from hibert.runtime.export import load_encoder, read_export

    state, cfg, meta = read_export(Path(export_dir))
    enc = HibertEncoder(cfg)
    load_encoder(enc, state)
    return enc.eval(), meta


def _max_diffs(enc, rows: list[list[list[int]]], t: dict, name: str) -> dict[str, float]:
    """Max abs differences of the HF outputs from the project's encoder on the same documents (packed layout)."""
    import torch

    from hibert.modeling import pack_documents

    with torch.no_grad():
        docs = pack_documents(rows)
        out = enc(docs)
        vectors = out.token_flat.index_select(0, docs.eos_index) + enc.position_embedding(docs.sent_pos)
        tokens = out.token_states
    sent = t[f"{name}.sentence_mask"].bool()
    hf_tokens = t[f"{name}.tokens"][sent]                       # [S, T, H]
    width = min(hf_tokens.shape[1], tokens.shape[1])
    assert not hf_tokens[:, width:].any() and not tokens[:, width:].any()   # zeros beyond the longest sentence
    assert not t[f"{name}.states"][~sent].any()                  # zeros at padding
    return {"document states": float((t[f"{name}.states"][sent] - out.sentence_states).abs().max()),
            "sentence vectors": float((t[f"{name}.vectors"][sent] - vectors).abs().max()),
            "token states": float((hf_tokens[:, :width] - tokens[:, :width]).abs().max())}


# ---------------------------------------------------------------- tests
@pytest.mark.slow
@pytest.mark.timeout(FIRST)
def test_the_folder_holds_what_hugging_face_and_an_upload_need(hf_run, exports):
    from safetensors import safe_open

    for kind in ("encoder", "extractive"):
        folder = hf_run["folders"][kind]
        assert {p.name for p in folder.iterdir()} == HF_FILES, kind
        cfg = json.loads((folder / "config.json").read_text())
        model = json.loads((exports[kind] / "model.json").read_text())
        meta = json.loads((exports[kind] / "export.json").read_text())
        assert cfg["model_type"] == "hibert"
        assert cfg["auto_map"]["AutoModel"] == "modeling_hibert.HibertModel"
        assert cfg["auto_map"]["AutoConfig"] == "configuration_hibert.HibertConfig"
        assert cfg["auto_map"]["AutoTokenizer"][0] == "tokenization_hibert.HibertTokenizer"
        for k in ("vocab_size", "hidden", "layers", "heads", "dropout", "max_positions", "norm_first", "activation"):
            assert cfg[k] == model[k], k
        assert cfg["ffn"] == (model["ffn"] or 4 * model["hidden"])
        assert json.loads((folder / "hibert_export.json").read_text()) == meta
        tok = json.loads((folder / "tokenizer_config.json").read_text())
        assert (tok["max_sentence_tokens"], tok["max_doc_sentences"]) == (
            meta["data"]["limits"]["max_sentence_tokens"], meta["data"]["limits"]["max_doc_sentences"])
        assert (folder / "tokenizer.model").read_bytes() == (exports[kind] / "tokenizer.model").read_bytes()
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
            assert f.metadata() == {"format": "pt"}
        card = (folder / "README.md").read_text()
        assert card.startswith("---\nlibrary_name: transformers\n")
        for value in (meta["git_commit"], meta["stage"], meta["dataset_manifest"],
                      f"| optimizer steps | {meta['step']} |"):
            assert str(value) in card, (kind, value)
        for metric, value in meta["metrics"].items():
            assert metric in card and f"{value:.4g}" in card, (kind, metric)
        if kind == "encoder":
            assert "models:/hibert-encoder@open-domain" in card
            assert cfg["architectures"] == ["HibertModel"] and all(not k.startswith("hibert.") for k in keys)
        else:
            assert cfg["architectures"] == ["HibertForSentenceLabelling"] and cfg["sentence_head"] == "softmax"
            assert cfg["auto_map"]["AutoModelForTokenClassification"] == "modeling_hibert.HibertForSentenceLabelling"
            assert cfg["extractive_selection"] == json.loads((exports[kind] / "extractive.json").read_text())
            assert {"classifier.weight", "classifier.bias"} <= keys
            assert all(k.startswith("hibert.") for k in keys - {"classifier.weight", "classifier.bias"})
    # nothing in the loading process's output complains about weights (missing, unexpected, newly initialised)
    for complaint in ("newly initialized", "not used", "UNEXPECTED", "MISSING", "MISMATCH"):
        assert complaint not in hf_run["stderr"], hf_run["stderr"][-3000:]


@pytest.mark.slow
@pytest.mark.timeout(FIRST)
def test_the_tokenizer_gives_the_projects_inference_input(hf_run, exports):
    """PTB text: the project's sentences and ids exactly, long documents in chunks of max_doc_sentences as the
    extractive summarizer scores them; pre-split sentences: the project's ids exactly; plain text: a simple split."""
    step = json.loads((exports["encoder"] / "export.json").read_text())["data"]["limits"]["max_doc_sentences"]
    docs = hf_run["docs"]
    for kind in ("encoder", "extractive"):
        t, info = hf_run["results"][kind]
        texts, ids = _project_sentences(exports[kind], docs["ptb"])
        rows, index = _chunks(ids, step)
        assert len(rows) > len(docs["ptb"]), "the sample should hold documents longer than max_doc_sentences"
        assert _rows(t, "ptb") == rows
        assert t["ptb.document_index"].tolist() == index
        assert info["batches"]["ptb"]["sentences"] == [s[a:a + step] for s in texts for a in range(0, len(s), step)]
        split_ids = _project_sentences(exports[kind], docs["plain"])[1]
        assert _rows(t, "split") == _chunks(split_ids, step)[0]
        plain = _rows(t, "plain")
        assert len(plain) >= len(docs["plain"]) and all(len(d) for d in plain)
        limit = json.loads((exports[kind] / "export.json").read_text())["data"]["limits"]["max_sentence_tokens"]
        assert max(len(s) for d in rows for s in d) == limit   # long sentences cut, as the project cuts them


@pytest.mark.slow
@pytest.mark.timeout(FIRST)
def test_hf_states_equal_the_projects_encoder(hf_run, exports):
    worst = {}
    for kind in hf_run["folders"]:
        enc, _ = _encoder(exports[kind])
        t, _ = hf_run["results"][kind]
        for name in ("ptb", "plain", "split"):
            diffs = _max_diffs(enc, _rows(t, name), t, name)
            for k, v in diffs.items():
                worst[k] = max(worst.get(k, 0.0), v)
            assert max(diffs.values()) <= TOLERANCE, (kind, name, diffs)
        if kind == "extractive":   # the base model of a folder with a head: the same encoder
            assert (t["ptb.head_states"] - t["ptb.states"]).abs().max() == 0
    print(f"\n[hf-export] max abs diff HF vs project (fp32): {worst}")


@pytest.mark.slow
@pytest.mark.timeout(FIRST)
def test_hf_sentence_labelling_scores_equal_the_projects_extractive_model(hf_run, exports):
    import torch

    from hibert.finetune.extractive.export import load_extractive, sentence_scores
    from hibert.modeling import pack_documents

    model, _ = load_extractive(exports["extractive"])
    t, info = hf_run["results"]["extractive"]
    assert info["head"] == "HibertForSentenceLabelling"
    worst = 0.0
    for name in ("ptb", "plain", "split"):
        rows = _rows(t, name)
        with torch.no_grad():
            logits = model(pack_documents(rows))
        sent = t[f"{name}.sentence_mask"].bool()
        worst = max(worst, float((t[f"{name}.scores"][sent] - sentence_scores(logits)).abs().max()),
                    float((t[f"{name}.logits"][sent] - logits).abs().max()))
        assert not t[f"{name}.scores"][~sent].any()
    print(f"\n[hf-export] max abs diff of extractive logits/scores: {worst:.3g}")
    assert worst <= TOLERANCE


def test_the_project_never_imports_transformers():
    """transformers is the `hf` extra's, for loading the folder: only the remote code copied into it imports it."""
    remote = REPO / "hibert" / "hf_export" / "remote"
    bad = []
    for top in ("hibert", "modeling", "data_prep", "pretrain", "finetune", "slurm", "configs"):
        for path in (REPO / top).rglob("*.py"):
            if remote in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                bad += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in ("transformers",
                                                                                               "huggingface_hub")]
    assert not bad, bad
    pyproject = (REPO / "pyproject.toml").read_text()
    deps = pyproject.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "transformers" not in deps and 'hf = ["transformers' in pyproject


def test_export_hf_refuses_what_it_cannot_convert(tmp_path):
    missing = run_hibert(["export-hf", tmp_path / "nothing", tmp_path / "out"], check=False, timeout=120)
    assert missing.returncode == 2 and "neither models:/... nor a directory" in missing.stderr, missing.stderr
    (tmp_path / "empty").mkdir()
    not_export = run_hibert(["export-hf", tmp_path / "empty", tmp_path / "out"], check=False, timeout=120)
    assert not_export.returncode == 1 and "is not an encoder export" in not_export.stderr, not_export.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_export_hf_keeps_a_non_empty_folder_unless_forced(exports, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    refused = run_hibert(["export-hf", exports["encoder"], out], check=False, timeout=300)
    assert refused.returncode == 1 and "--force" in refused.stderr and (out / "mine.txt").is_file()
    run_hibert(["export-hf", exports["extractive"], out, "--force", "--encoder-only"], timeout=300)
    assert {p.name for p in out.iterdir()} == HF_FILES
    assert json.loads((out / "config.json").read_text())["architectures"] == ["HibertModel"]
    assert not list(tmp_path.glob("hf.*"))   # no .partial / .old left
