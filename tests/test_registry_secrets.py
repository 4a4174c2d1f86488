"""Credentials never reach MLflow params or printed URIs; `hibert registry` is read-only and precise about
what is missing; checkpoints are loaded only when this platform's completion marker vouches for them."""
import argparse
import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from conftest import REPO
from hibert import registry_cli
from hibert.redact import MASK, is_secret_name, redact_config_dict, redact_uri
from hibert.runtime.checkpoint import FORMAT, MARKER, CheckpointManager, verify, write_marker

pytestmark = pytest.mark.timeout(120)

# ------------------------------------------------------------------ redaction table

SECRETS = ["hunter2", "s3cr3t", "abc123tok", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "wJalrXUtnFEMI",
           "hf_abcdefghijklmnopqrstuvwxyzABCD", "AKIAIOSFODNN7EXAMPLE", "p@ss"]


@pytest.mark.parametrize("text, expected", [
    ("https://bob:hunter2@mlflow.example.org:5000", "https://bob:***@mlflow.example.org:5000"),
    ("postgresql://mlflow:s3cr3t@db.internal:5432/mlflow", "postgresql://mlflow:***@db.internal:5432/mlflow"),
    ("postgresql+psycopg2://u:p@ss@db/mlflow", "postgresql+psycopg2://u:***@db/mlflow"),  # unencoded @
    ("https://ghp_abcdefghijklmnopqrstuvwxyz0123456789@github.com/org/repo.git", "https://***@github.com/org/repo.git"),
    ("http://mlflow:5000/api?token=abc123tok&experiment=3", "http://mlflow:5000/api?token=***&experiment=3"),
    ("mysql://db/mlflow?user=me&password=s3cr3t", "mysql://db/mlflow?user=me&password=***"),
    ("https://acct.blob.core.windows.net/c?sv=2022&sig=abc123tok",
     "https://acct.blob.core.windows.net/c?sv=2022&sig=***"),
    ("export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyzABCD", "export HF_TOKEN=***"),
    ("export AWS_SECRET_ACCESS_KEY='wJalrXUtnFEMI/K7MDENG'", "export AWS_SECRET_ACCESS_KEY='***'"),
    ('MLFLOW_TRACKING_PASSWORD="hunter2 x" hibert pretrain demo',
     'MLFLOW_TRACKING_PASSWORD="***" hibert pretrain demo'),
    ("curl -H 'X-Api-Key: abc123tok' https://h/x", "curl -H 'X-Api-Key: ***' https://h/x"),
    ("Authorization: Bearer abc123tok", "Authorization: ***"),
    ("wandb login --password hunter2 --relogin", "wandb login --password *** --relogin"),
    ("AccountName=acct;AccountKey=abc123tok==;EndpointSuffix=core.windows.net",
     "AccountName=acct;AccountKey=***;EndpointSuffix=core.windows.net"),
    ("aws key AKIAIOSFODNN7EXAMPLE in a line", "aws key *** in a line"),
    # passwords holding what a URI may not, unencoded: / # ? and spaces
    ("http://bob:hun/ter#2?x y@mlflow.example.org:5000/api", "http://bob:***@mlflow.example.org:5000/api"),
    ("tracking.uri=https://bob:a b@host", "tracking.uri=https://bob:***@host"),
    # quotes in the password, an IPv6 host, a port that is not one; the credential after an auth scheme
    ("http://alice:it's-hunter2@127.0.0.1:1", "http://alice:***@127.0.0.1:1"),
    ('https://alice:pa"s3cr3t@host:5000', "https://alice:***@host:5000"),
    ("'http://bob:hunter2@[::1]:5000'", "'http://bob:***@[::1]:5000'"),
    ("https://bob:hunter2@[::1", "https://bob:***@[::1"),
    ("http://bob:hunter2@host:notaport", "http://bob:***@host:notaport"),
    ("auth=Basic YWxpY2U6aHVudGVyMg== next", "auth=*** next"),
    ("curl --auth bearer abc123tok https://h", "curl --auth *** https://h"),
    ("https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXX", "https://hooks.slack.com/services/***"),
    ("https://discord.com/api/webhooks/123/abcDEF", "https://discord.com/api/webhooks/***"),
    ("mysql -u root -p hunter2 mlflow", "mysql -u root -p *** mlflow"),
    # nothing to hide: unchanged
    ("http://10.0.0.5:5000", "http://10.0.0.5:5000"),
    ("sqlite:////shared/mlflow/mlflow.db", "sqlite:////shared/mlflow/mlflow.db"),
    ("models:/hibert-encoder@in-domain", "models:/hibert-encoder@in-domain"),
    ("export PATH=/opt/bin:$PATH", "export PATH=/opt/bin:$PATH"),
    ("export TOKENIZERS_PARALLELISM=false", "export TOKENIZERS_PARALLELISM=false"),
    ("module load cuda/12.4 nccl", "module load cuda/12.4 nccl"),
])
def test_redact_uri_table(text, expected):
    assert redact_uri(text) == expected


@pytest.mark.parametrize("name, secret", [
    ("MLFLOW_TRACKING_PASSWORD", True), ("AWS_SECRET_ACCESS_KEY", True), ("HF_TOKEN", True),
    ("WANDB_API_KEY", True), ("PGPASSWORD", True), ("X-Api-Key", True), ("accessToken", True),
    ("GOOGLE_APPLICATION_CREDENTIALS", True), ("AWS_SESSION_TOKEN", True), ("MYSQL_PWD", True),
    ("NCCL_DEBUG", False), ("TOKENIZERS_PARALLELISM", False), ("batch_tokens", False), ("tokenizer", False),
    ("MLFLOW_TRACKING_URI", False), ("MLFLOW_TRACKING_USERNAME", False), ("PATH", False), ("signal_grace_s", False),
])
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


def test_redact_config_dict_masks_by_name_and_shape_and_leaves_the_input_alone():
    cfg = {"tracking": {"uri": "https://bob:hunter2@mlflow:5000", "experiment": "hibert"},
           "slurm": {"env": {"HF_TOKEN": "hf_x", "NCCL_DEBUG": "INFO", "EMPTY_TOKEN": "",
                             "MLFLOW_TRACKING_URI": "http://u:s3cr3t@h:5000"},
                     "setup": ["module load cuda", "export WANDB_API_KEY=abc123tok"],
                     "credentials": {"user": "me", "pass": "p"}},
           "schedule": {"batch_tokens": 4096}}
    before = json.dumps(cfg, sort_keys=True)
    out = redact_config_dict(cfg)
    assert json.dumps(cfg, sort_keys=True) == before  # a copy: the caller's dict is untouched
    assert out["tracking"] == {"uri": "https://bob:***@mlflow:5000", "experiment": "hibert"}
    assert out["slurm"]["env"] == {"HF_TOKEN": MASK, "NCCL_DEBUG": "INFO", "EMPTY_TOKEN": "",
                                   "MLFLOW_TRACKING_URI": "http://u:***@h:5000"}
    assert out["slurm"]["setup"] == ["module load cuda", "export WANDB_API_KEY=***"]
    assert out["slurm"]["credentials"] == {"user": MASK, "pass": MASK}
    assert out["schedule"] == {"batch_tokens": 4096}


def test_no_shipped_recipe_loses_a_param_to_redaction():
    from hibert.config import config_to_dict, load_config

    for recipe in sorted((REPO / "configs" / "recipes").glob("*.yaml")):
        d = config_to_dict(load_config(str(recipe), []))
        assert redact_config_dict(d) == d, recipe.name


# ------------------------------------------------------------------ params of a real MLflow run

@pytest.fixture
def mlflow_env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # MLflow exports these: undo at teardown
        monkeypatch.setenv(var, "unset")
    yield
    import mlflow

    while mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(None)  # MLflow's in-process default ("" would mean a file store in the cwd)


def test_tracker_logs_no_secret_as_param_or_tag(tmp_path, mlflow_env):
    from hibert.config import load_config
    from hibert.registry import client
    from hibert.runtime.tracking import Tracker

    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    cfg = load_config(None, [
        f"tracking.uri={uri}", f"run.output_dir={tmp_path / 'runs'}", "run.name=secrets",
        "slurm.env.HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyzABCD", "slurm.env.AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI",
        "slurm.env.MLFLOW_TRACKING_URI=https://bob:hunter2@mlflow.example.org", "slurm.env.NCCL_DEBUG=INFO",
        "slurm.setup=['module load cuda', 'export MLFLOW_TRACKING_PASSWORD=s3cr3t', 'source /opt/venv/bin/activate']",
        "slurm.srun_args=['--container-env=WANDB_API_KEY=abc123tok']"])
    tracker = Tracker(cfg, enabled=True)
    run_id = tracker.start(None, {"stage": "none", "init": "https://x:p@ss@host/m"})
    tracker.end()
    data = client(uri).get_run(run_id).data
    logged = json.dumps({"params": data.params, "tags": data.tags})
    for secret in SECRETS:
        assert secret not in logged, secret
    # the rest of the config is still there, readable
    assert data.params["slurm.env.NCCL_DEBUG"] == "INFO"
    assert data.params["slurm.env.HF_TOKEN"] == MASK
    assert data.params["slurm.env.MLFLOW_TRACKING_URI"] == "https://bob:***@mlflow.example.org"
    setup = data.params["slurm.setup"]
    assert "module load cuda" in setup and "MLFLOW_TRACKING_PASSWORD=***" in setup
    assert data.params["tracking.uri"] == uri and data.params["run.name"] == "secrets"
    # the local resolved config is untouched by redaction (a resume reruns it)
    assert cfg.slurm.env["HF_TOKEN"].startswith("hf_")


# ------------------------------------------------------------------ hibert registry list|show

def _registry(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    registry_cli.add_arguments(p)
    return registry_cli.run(p.parse_args(argv))


@pytest.fixture
def store_with_encoder(tmp_path, mlflow_env):
    import mlflow

    from hibert.registry import ensure_experiment, register_artifact_dir

    (tmp_path / "store").mkdir()
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    ensure_experiment(uri, "exp")
    with mlflow.start_run() as run:
        mlflow.log_text("{}", "export/model.json")
    register_artifact_dir(uri, run.info.run_id, "export", "hibert-encoder", "open-domain")
    register_artifact_dir(uri, run.info.run_id, "export", "hibert-encoder", "in-domain")
    return uri


def test_registry_show_missing_alias_version_or_model_is_an_error(store_with_encoder, capsys):
    uri = store_with_encoder
    assert _registry(["show", "hibert-encoder@in-domain", "--uri", uri]) == 0
    assert "v2" in capsys.readouterr().out

    assert _registry(["show", "hibert-encoder@finetuned", "--uri", uri]) == 1
    err = capsys.readouterr()
    assert "'hibert-encoder'" in err.err and "'finetuned'" in err.err
    assert "in-domain, open-domain" in err.err and "no registered models" not in err.out + err.err

    assert _registry(["show", "hibert-encoder/7", "--uri", uri]) == 1
    err = capsys.readouterr().err
    assert "no version '7'" in err and "versions: 1, 2" in err

    assert _registry(["show", "hibert-encodr@in-domain", "--uri", uri]) == 1
    err = capsys.readouterr().err
    assert "no registered model 'hibert-encodr'" in err and "registered: hibert-encoder" in err

    assert _registry(["list", "--uri", uri]) == 0
    assert capsys.readouterr().out.count("hibert-encoder") == 2


def _tree(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_registry_list_and_show_create_nothing_without_a_store(tmp_path):
    cwd = tmp_path / "empty"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    before = _tree(tmp_path)
    lst = subprocess.run([sys.executable, "-m", "hibert.cli", "registry", "list"], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=60)
    show = subprocess.run([sys.executable, "-m", "hibert.cli", "registry", "show", "hibert-encoder@in-domain"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert _tree(tmp_path) == before == ["empty"]  # no runs/, no mlflow.db, no mlruns/
    expected = f"no MLflow store at {cwd / 'runs' / 'mlflow.db'}; runs create it"
    assert lst.returncode == 0 and expected in lst.stdout, lst
    assert show.returncode == 1 and expected in show.stderr, show


# ------------------------------------------------------------------ checkpoint markers

def _tag(root, step: int, files: dict[str, bytes]):
    tag = root / f"step_{step:09d}"
    tag.mkdir(parents=True)
    for name, data in files.items():
        (tag / name).write_bytes(data)
    return tag


def test_verify_refuses_markers_this_platform_did_not_write(tmp_path):
    tag = _tag(tmp_path, 10, {"mp_rank_00_model_states.pt": b"x" * 100})
    # what the platform wrote before markers named their writer (and what any other tool could write)
    (tag / MARKER).write_text(json.dumps({"step": 10, "files": {"mp_rank_00_model_states.pt": 100}, "state": {}}))
    ok, why = verify(tag)
    assert not ok and "not written by this platform" in why and FORMAT in why
    # a marker claiming our format but without fingerprints
    (tag / MARKER).write_text(json.dumps({"format": FORMAT, "files": {"mp_rank_00_model_states.pt": 100}}))
    ok, why = verify(tag)
    assert not ok and "fingerprints" in why
    write_marker(tag, step=10, world_size=1, state={})
    assert verify(tag) == (True, "ok")


def test_verify_detects_swapped_content_and_unlisted_files(tmp_path):
    big = bytes(range(256)) * (3 * 4096)  # 3 MiB: only its first and last MiB are fingerprinted
    tag = _tag(tmp_path, 4, {"zero_pp_rank_0_mp_rank_00_optim_states.pt": big, "rng_rank00000.safetensors": b"r" * 10})
    write_marker(tag, step=4, world_size=1, state={"epoch": 0})
    assert verify(tag) == (True, "ok")
    shard = tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(b"EVIL" + big[4:])  # same size, another pickle program at the start
    ok, why = verify(tag)
    assert not ok and "fingerprint" in why
    shard.write_bytes(big)
    assert verify(tag)[0]
    (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"planted")  # DeepSpeed globs for shards
    ok, why = verify(tag)
    assert not ok and "not in the marker" in why and "rank_1" in why
    (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    shard.write_bytes(big[:100])
    ok, why = verify(tag)
    assert not ok and "truncated" in why


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_manager_skips_foreign_tags_and_never_prunes_for_them(tmp_path, one_rank_group, caplog):
    root = tmp_path / "checkpoints"
    ours = _tag(root, 2, {"mp_rank_00_model_states.pt": b"m" * 64})
    write_marker(ours, step=2, world_size=1, state={"global_step": 2})
    foreign = _tag(root, 4, {"mp_rank_00_model_states.pt": b"f" * 64})
    (foreign / MARKER).write_text(json.dumps({"step": 4, "world_size": 1, "state": {"global_step": 4},
                                              "files": {"mp_rank_00_model_states.pt": 64}}))
    mgr = CheckpointManager(root, keep_last=1, rank=0, world_size=1)
    with caplog.at_level("WARNING"):
        cands = mgr.candidates()
    assert [c.tag for c in cands] == ["step_000000002"] and cands[0].state == {"global_step": 2}
    assert "step_000000004 skipped" in caplog.text and "not written by this platform" in caplog.text
    with pytest.raises(FileNotFoundError, match="not written by this platform"):
        mgr.resume(engine=None, explicit=str(foreign))
    mgr._prune(ours)  # keep_last=1: the newer foreign tag must not push ours out, nor be deleted or set aside
    assert ours.is_dir() and foreign.is_dir()
    # only foreign tags left: an error, not a silent fresh start on top of them
    import shutil

    shutil.rmtree(ours)
    with pytest.raises(RuntimeError, match="not written by this platform.*checkpoint.resume=never"):
        mgr.resume(engine=None)


def test_print_config_and_config_errors_never_show_a_secret(capsys):
    """--print-config and a config error echo what the user typed: credentials in every shape are masked."""
    from hibert.cli import main

    secrets = ["tracking.uri=https://bob:hun/ter#2@mlflow.example.org:5000",
               "slurm.env={HF_TOKEN: hf_abcdefghijklmnopqrstuvwxyzABCD, WANDB_API_KEY: s3cr3t}",
               "slurm.setup=[export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI, mysql -u me -p abc123tok db]"]
    assert main(["finetune", "demo", *secrets, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "mlflow.example.org" in out and "HF_TOKEN" in out
    for leaked in ("hun/ter#2", "hf_abcdefghijklmnopqrstuvwxyzABCD", "s3cr3t", "wJalrXUtnFEMI", "abc123tok"):
        assert leaked not in out, leaked
    assert main(["finetune", "demo", *secrets, "run.name=not a name"]) == 2
    err = capsys.readouterr().err
    assert "run.name" in err and not any(s in err for s in ("hun/ter#2", "s3cr3t", "abc123tok"))


def test_config_files_and_values_that_cannot_work_are_one_line(tmp_path, capsys):
    from hibert.cli import main

    assert main(["finetune", str(tmp_path), "--print-config"]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["finetune", "demo", "run.output_dir=${run.output_dir}", "--print-config"]) == 2
    assert "interpolation is one level" in capsys.readouterr().err
    assert not (tmp_path / "${run.output_dir}").exists()
    bomb = tmp_path / "bomb.yaml"   # a YAML alias bomb: tiny file, huge value; the error stays short
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                    "run: {name: [*d, *d, *d, *d, *d, *d, *d, *d, *d]}\n")
    assert main(["finetune", str(bomb), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "run.name" in err and len(err) < 2000


def test_log_lines_and_uncaught_tracebacks_are_masked():
    """What a job writes to its .err file: log lines and the traceback of an exception nobody caught (an MLflow
    error quoting its store URI) go through the same redaction."""
    import subprocess
    import sys

    code = ("from hibert.logs import setup_logging\nimport logging\nsetup_logging(0)\n"
            "logging.getLogger('hibert.x').warning('retrying https://bob:hun/ter#2@mlflow.example.org:5000/api')\n"
            "raise RuntimeError('cannot reach postgresql://u:s3cr3t@db:5432/mlflow, token=abc123tok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "RuntimeError: cannot reach postgresql://u:***@db:5432/mlflow" in r.stderr
    assert "https://bob:***@mlflow.example.org:5000/api" in r.stderr
    assert not any(s in r.stderr for s in ("hun/ter#2", "s3cr3t", "abc123tok"))


def test_an_unreachable_tracking_server_is_one_line_within_seconds(capsys, monkeypatch):
    """A tracking server that does not answer: `registry list`, a training command (before any rank starts) and
    a models:/ reference each fail in seconds with one line naming the server, its password masked (MLflow's own
    retry policy took minutes); the HTTP retry policy every command sets is bounded."""
    import os
    import socket
    import time

    from hibert.cli import main

    with socket.socket() as s:           # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://bob:hunter2@127.0.0.1:{port}"
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    t0 = time.time()
    assert main(["registry", "list", "--uri", uri]) == 1
    assert main(["finetune", "demo", f"tracking.uri={uri}", "--nproc", "2"]) == 1
    assert main(["summarize", f"tracking.uri={uri}", "--model", "models:/hibert-extractive@finetuned",
                 "--input", __file__]) == 2
    assert time.time() - t0 < 30
    err = capsys.readouterr().err
    assert err.count(f"tracking server http://bob:***@127.0.0.1:{port} is unreachable") == 3 and "hunter2" not in err
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"


def test_a_copied_store_refuses_to_log_into_the_original(tmp_path, capsys, monkeypatch):
    """MLflow keeps the experiment's artifact location absolute: a copied run directory's store would write its
    artifacts into the original. Training and evaluate refuse in one line before writing anything."""
    import shutil

    from hibert.errors import UserError
    from hibert.registry import check_store_location, ensure_experiment

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)    # restored as it was after the test
    original, copy = tmp_path / "original", tmp_path / "copy"
    original.mkdir()
    ensure_experiment(f"sqlite:///{original / 'mlflow.db'}", "hibert")
    check_store_location(f"sqlite:///{original / 'mlflow.db'}", "hibert")
    shutil.copytree(original, copy)
    with pytest.raises(UserError, match=r"was copied or moved: its experiment 'hibert' writes artifacts to .*original"):
        check_store_location(f"sqlite:///{copy / 'mlflow.db'}", "hibert")
    check_store_location(f"sqlite:///{copy / 'mlflow.db'}", "hibert-copy")   # a new experiment: fine
    from hibert.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)   # ensure_experiment exported the original's
    assert main(["evaluate", f"run.output_dir={copy}", "run.name=x", "--split", "test"]) == 2
    assert "was copied or moved" in capsys.readouterr().err and not (copy / "x").exists()


def test_redaction_takes_linear_time_on_long_hostile_strings():
    """Each pattern starts once per word: a long unbroken value, a long dotted name, many schemes without '@' or
    deeply nested assignments are scanned in time linear in their length (a 40,000-character value took a
    minute), and nesting past _MAX_NESTING is masked."""
    import time

    from hibert.redact import redact_uri

    n = 200_000
    for text in ("x" * n, "ab." * (n // 3), "a=" * (n // 2), "a: " * (n // 3), "--a " * (n // 4),
                 "http://" * (n // 7), "x://a:" * (n // 6), "a:b@" * (n // 4)):
        t0 = time.perf_counter()
        redact_uri(text)
        assert time.perf_counter() - t0 < 3.0, text[:12]
    assert redact_uri("a=" * 20 + "b").endswith("=***")
    assert redact_uri("--container-env=WANDB_API_KEY=abc https://u:p/w@h:5/x") == \
        "--container-env=WANDB_API_KEY=*** https://u:***@h:5/x"


@pytest.mark.timeout(180)
def test_a_run_ended_on_a_server_prints_no_password_and_the_resolved_config_is_owner_only(tmp_path, capfd):
    """MLflow prints "View run ... at: <tracking URI>" when a run on a server ends, user:password@ included:
    suppressed for every client this platform makes. config.resolved.yaml, which keeps the real URI for a
    resume, is readable by its owner only."""
    import stat

    from hibert.config import Config
    from hibert.config.load import save_resolved
    from hibert.registry import client, experiment_id
    from hibert.runtime.tracking import send
    from serving_helpers import free_port, kill_group, tracking_server

    port = free_port()
    server = tracking_server(tmp_path / "server", port)
    try:
        uri = f"http://alice:Sup3rSecretPW@127.0.0.1:{port}"
        run_id = client(uri).create_run(experiment_id(uri, "hibert")).info.run_id
        send(uri, [{"op": "end", "status": "FINISHED", "run_id": run_id}])
        assert client(uri).get_run(run_id).info.status == "FINISHED"
        out = capfd.readouterr()
        assert "Sup3rSecretPW" not in out.out + out.err and "View run" not in out.out
    finally:
        kill_group(server)
    cfg = Config()
    cfg.tracking.uri = uri
    path = save_resolved(cfg, tmp_path / "run")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "Sup3rSecretPW" in path.read_text()
