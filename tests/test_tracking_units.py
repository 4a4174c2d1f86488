"""The tracking edge cases that need no real tracking server: a proxy answering 5xx, TLS with a private CA, a
malformed URI, an outbox line cut by a crash, an evaluation run sent twice, and what the pyfunc returns for an
empty document or a None param. Servers here are a few lines of http.server in a thread."""
from __future__ import annotations

import contextlib
import datetime
import http.server
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from hibert.errors import UserError
from hibert.registry import _probe, check_reachable
from hibert.runtime.outbox import Outbox, drain

pytestmark = pytest.mark.timeout(120)


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200
    body = b'{"error_code": "RESOURCE_DOES_NOT_EXIST"}'   # what MLflow's REST API answers

    def _answer(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json" if self.body.startswith(b"{") else "text/html")
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _server(status: int, tls: ssl.SSLContext | None = None, body: bytes | None = None) -> Iterator[int]:
    """An HTTP(S) server on 127.0.0.1 answering every request with `status` (and `body`: by default an MLflow
    JSON error); yields its port."""
    handler = type("H", (_Health,), {"status": status, **({"body": body} if body is not None else {})})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


# ------------------------------------------------------------------ a proxy whose backend is down

def test_a_5xx_is_an_outage_and_only_a_4xx_is_a_refusal(tmp_path, monkeypatch):
    """A reverse proxy answering 502 while the tracking server behind it is down: the probe says unreachable,
    and what the run logs meanwhile stays queued (a registration stays pending) instead of being rejected."""
    from mlflow.exceptions import MlflowException, get_error_code
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE

    from hibert.config import Config
    from hibert.runtime.tracking import Tracker

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")   # MLflow would retry each 502 for seconds
    with _server(502) as port:
        uri = f"http://127.0.0.1:{port}"
        assert _probe(uri, 5) == "HTTP 502 Bad Gateway"
        cfg = Config()
        cfg.tracking.uri, cfg.run.output_dir = uri, str(tmp_path)
        tracker = Tracker(cfg, enabled=True, run_dir=tmp_path)
        tracker.run_id = "0" * 32
        tracker.metrics({"loss": 1.0}, 1)
        registry_json = tmp_path / "export" / "registry.json"
        assert tracker.register("export", "hibert-x", "finetuned", {}, [], registry_json) is None
        assert tracker.offline_since is not None and tracker.pending() == 2 and tracker.rejected() == 0
    with _server(404) as port:   # MLflow's JSON answer for a missing experiment: reachable
        assert _probe(f"http://127.0.0.1:{port}", 5) is None
    for status in (200, 404):   # another web server on the port (python -m http.server, a proxy's page): one line
        with _server(status, body=b"<html>Not Found</html>") as port:
            assert "is not an MLflow tracking server" in _probe(f"http://127.0.0.1:{port}", 5)
            with pytest.raises(UserError, match=r"answers HTTP \d+ but is not an MLflow tracking server"):
                check_reachable(f"http://127.0.0.1:{port}", 5)
    with _server(401, body=b"<html>log in</html>") as port:   # authentication in front of MLflow: live
        assert _probe(f"http://127.0.0.1:{port}", 5) is None

    box = Outbox(tmp_path / "unit")
    for i in range(4):
        box.append({"op": "end", "run_id": str(i), "status": "FINISHED"})

    def send(ops):
        if ops[0]["run_id"] == "0":
            raise MlflowException("bad value", error_code=INVALID_PARAMETER_VALUE)   # 400: refused
        if ops[0]["run_id"] == "1":   # MLflow's 500 for a proxy's 413: the server's /health answers, so refused
            raise MlflowException("failed with error code 413", error_code=get_error_code(413))
        raise MlflowException("backend down", error_code=TEMPORARILY_UNAVAILABLE)     # 503: kept

    assert drain(box, send, lambda: True) == 2   # the server "answers" (its /health), yet a 503 is no refusal
    assert [o["run_id"] for o in box.read()] == ["2", "3"] and box.rejected() == 2
    down = Outbox(tmp_path / "down")
    down.append({"op": "end", "run_id": "1", "status": "FINISHED"})
    assert drain(down, send, lambda: False) == 1 and down.rejected() == 0   # the same 500 while /health fails: kept


# ------------------------------------------------------------------ TLS with a private CA

def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "internal-ca")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_pem, key_pem = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert_pem, key_pem


def test_the_probe_verifies_tls_as_mlflow_does(tmp_path, monkeypatch):
    """An HTTPS tracking server signed by an internal CA: unreachable by default, reachable with the CA bundle
    MLflow is told about, or with verification off, as MLflow's own client would see it."""
    cert, key = _self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    for var in ("MLFLOW_TRACKING_SERVER_CERT_PATH", "MLFLOW_TRACKING_INSECURE_TLS", "REQUESTS_CA_BUNDLE",
                "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    with _server(200, tls) as port:
        uri = f"https://127.0.0.1:{port}"
        assert "CERTIFICATE_VERIFY_FAILED" in (_probe(uri, 5) or "")
        for var, value in (("MLFLOW_TRACKING_SERVER_CERT_PATH", str(cert)), ("REQUESTS_CA_BUNDLE", str(cert)),
                           ("MLFLOW_TRACKING_INSECURE_TLS", "true")):
            with monkeypatch.context() as m:
                m.setenv(var, value)
                assert _probe(uri, 5) is None, var


# ------------------------------------------------------------------ a malformed URI

@pytest.mark.parametrize("uri", ["http://alice:pw-x1@127.0.0.1:70000", "http://alice:pw-x1@127.0.0.1:notaport",
                                 "https://alice:pw-x1@[::1"])
def test_a_malformed_tracking_uri_is_one_line_with_its_password_masked(uri, capsys):
    with pytest.raises(UserError, match="is malformed") as e:
        check_reachable(uri)
    assert "pw-x1" not in str(e.value) and "alice:***@" in str(e.value)
    from hibert.cli import main

    assert main(["registry", "list", "--uri", uri]) == 1
    err = capsys.readouterr().err
    assert "is malformed" in err and "pw-x1" not in err and "Traceback" not in err


# ------------------------------------------------------------------ the outbox file

def test_an_append_after_a_line_cut_by_a_crash_keeps_the_outbox_readable(tmp_path):
    box = Outbox(tmp_path)
    def op(step: int) -> dict:
        return {"op": "metrics", "run_id": "r", "values": {"a": 1.0}, "step": step, "timestamp": step}

    box.append(op(1))
    with box.path.open("a") as f:
        f.write('{"op": "metrics", "run_id": "r", "val')   # a kill -9 in the middle of a write
    box.append(op(3))
    box.append(op(4))
    assert [o["step"] for o in box.read()] == [1, 3, 4]


# ------------------------------------------------------------------ an evaluation run sent twice

def test_a_resent_evaluation_run_has_its_per_document_table_once(tmp_path, monkeypatch):
    """The first try reached the server up to the table, then failed: the resend reuses the run and must not
    append the table a second time (MLflow's log_table appends to an existing file)."""
    import mlflow

    from conftest import seed_store
    from hibert.registry import client
    from hibert.runtime.tracking import evaluation_op, send

    monkeypatch.chdir(tmp_path)
    seed_store(tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.md").write_text("# report\n")
    table = {"doc": ["a", "b"], "rouge1": [0.5, 0.25]}
    op = evaluation_op(Outbox(tmp_path / "eval"), "hibert", "eval", {}, {"split": "test"}, {"rouge1": 0.4},
                       report, table)
    real_end = mlflow.MlflowClient.set_terminated
    monkeypatch.setattr(mlflow.MlflowClient, "set_terminated",
                        lambda *a, **k: (_ for _ in ()).throw(ConnectionError("gone")))
    with pytest.raises(ConnectionError):
        send(uri, [op])
    monkeypatch.setattr(mlflow.MlflowClient, "set_terminated", real_end)
    run_id = send(uri, [op])
    local = client(uri).download_artifacts(run_id, "report/per_document.json", str(tmp_path / "dl"))
    assert len(json.loads(Path(local).read_text())["data"]) == 2


# ------------------------------------------------------------------ the pyfunc: empty documents, None params

class _Encoder:
    cfg = SimpleNamespace(max_doc_sentences=8)

    def __call__(self, text: str, doc_id: str):
        sentences = [s for s in text.replace("\ufeff", "").split(".") if s.strip()]   # a BOM alone: none
        return sentences, [[1, 2]] * len(sentences), False


class _Decoder:
    def summarize_ids(self, batch, generation=None, graphs=None):
        return [SimpleNamespace(sentences=["an abstract"], ids=list(range(8))) for _ in batch]


def test_served_rows_match_the_cli_for_an_empty_document_and_none_params(tmp_path):
    """A batch of a normal text and one without sentences: integer `subwords` in every row, no NaN (the CLI
    prints 0 for the empty one); and `k=None` asks an extractive model for its own k, as None does for the
    decoding heads' params."""
    from hibert.finetune.abstractive.summarize import AbstractiveSummarizer
    from hibert.finetune.serving.pyfunc import HibertPyfunc
    from hibert.heads import get_head

    summarizer = object.__new__(AbstractiveSummarizer)
    summarizer.encode, summarizer.decoder = _Encoder(), _Decoder()
    served = object.__new__(HibertPyfunc)
    served.head, served.clusters, served.max_chars = SimpleNamespace(decodes=False, name="x"), False, 10_000
    served.summarizer, served.settings, served.model_note = summarizer, None, None
    out = served.predict({"id": ["a", "b"], "text": ["One. Two.", "\ufeff"]})
    records = json.loads(out.to_json(orient="records"))
    assert records == [s.record(False) for s in summarizer.summarize_all([("a", "One. Two."), ("b", "\ufeff")])]
    assert [r["subwords"] for r in records] == [8, 0] and str(out["subwords"].dtype) == "int64"

    (tmp_path / "extractive.json").write_text(json.dumps({"top_k": 3, "trigram_blocking": True}))
    served.head, served.export_dir, served.max_batch_size = get_head("extractive"), tmp_path, 16
    served.settings = get_head("extractive").inference.stored(tmp_path)
    assert served._overrides({"k": None}) == {"settings": served.settings}   # the model's own selection
    assert served._overrides({"k": 2})["settings"].model_dump() == {"top_k": 2, "trigram_blocking": True}
    with pytest.raises(Exception, match=r"unknown params \['foo'\]: this model takes \['k'\]"):
        served._overrides({"k": None, "foo": 3})
    # another head's params, as the signature passes them on: None is "not given", a value is refused as the CLI
    # refuses the flag (the same bounds and refusals on every head)
    assert served._overrides({"k": None, "beam": None, "batch_size": None}) == {"settings": served.settings}
    for param in ({"beam": -1}, {"batch_size": 20}):
        with pytest.raises(Exception, match=rf"params.{next(iter(param))}: does not apply to an extractive model "
                                            r"\(its params: params.k\)"):
            served._overrides({"k": None, **param})


# ------------------------------------------------------------------ a server gone between the check and the start

def test_a_server_gone_before_the_run_starts_is_one_line_or_the_outbox(tmp_path, monkeypatch):
    """The server answered the check before the ranks started, then went: a new run (it needs its id from the
    server) stops in one line after `outage_wait_s`; a resumed run trains on, the rest of its start queued and
    sent once the server is back."""
    import socket

    from conftest import seed_store
    from hibert.config import Config
    from hibert.registry import client
    from hibert.runtime.tracking import Tracker, send

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = Config()
    cfg.tracking.uri, cfg.run.output_dir, cfg.tracking.outage_wait_s = f"http://bob:hunter2@127.0.0.1:{port}", \
        str(tmp_path), 0.0
    tracker = Tracker(cfg, enabled=True, run_dir=tmp_path)
    with pytest.raises(UserError, match="stopped answering before the run started") as e:
        tracker.start(None, {"stage": "x"})
    assert "hunter2" not in str(e.value)
    assert tracker.start("0" * 32, {"stage": "x"}) == "0" * 32
    assert tracker.offline_since is not None and [o["op"] for o in tracker.outbox.read()] == ["resume"]

    seed_store(tmp_path / "store" / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    c = client(uri)
    run_id = c.create_run(c.get_experiment_by_name("Default").experiment_id).info.run_id
    c.set_terminated(run_id, "KILLED")
    send(uri, [{**tracker.outbox.read()[0], "run_id": run_id}])
    run = c.get_run(run_id)
    assert run.info.status == "RUNNING" and run.data.tags["stage"] == "x"


def test_refused_operations_are_sent_again_with_sync_rejected(tmp_path, capsys):
    """What a server refused (a 401 while a token had expired) is kept, not lost: `hibert registry sync RUN_DIR
    --rejected` puts it back in front of what is pending and sends it."""
    import argparse

    import mlflow

    from hibert import registry_cli
    from hibert.config import Config, save_resolved

    cfg = Config()
    cfg.run.output_dir = str(tmp_path)
    cfg.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    save_resolved(cfg, run_dir)
    client = mlflow.MlflowClient(cfg.tracking.uri)
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    box = Outbox(run_dir)
    box.reject({"op": "metrics", "run_id": run_id, "values": {"loss": 2.0}, "step": 1, "timestamp": 1000},
               "MlflowException: 401 Unauthorized")

    def sync(*flags: str) -> int:
        p = argparse.ArgumentParser()
        registry_cli.add_arguments(p)
        return registry_cli.run(p.parse_args(["sync", str(run_dir), "--uri", cfg.tracking.uri, *flags]))

    assert sync() == 0 and "--rejected sends them again" in capsys.readouterr().out
    box.append({"op": "end", "run_id": run_id, "status": "FINISHED"})
    assert sync("--rejected") == 0 and "sent 2 operation(s)" in capsys.readouterr().out
    assert client.get_metric_history(run_id, "loss")[0].value == 2.0
    assert client.get_run(run_id).info.status == "FINISHED" and box.rejected() == 0 and len(box) == 0


def test_a_resumed_run_logs_each_metric_once_per_step(tmp_path):
    """A run resumed from a checkpoint older than its last logged step replays those steps: their metrics are not
    logged again (per metric: a validation metric of a replayed step that the killed process never logged still
    is); a new MLflow run in the same directory starts its own record."""
    import mlflow

    from conftest import seed_store
    from hibert.config import Config
    from hibert.runtime.tracking import Tracker

    seed_store(tmp_path / "mlflow.db")
    cfg = Config()
    cfg.run.output_dir, cfg.tracking.uri = str(tmp_path), f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(cfg, enabled=True, run_dir=tmp_path / "run")
    run_id = first.start(None, {"stage": "x"})
    for step in (3, 6):
        first.metrics({"train_loss": step / 10}, step)
    # killed after step 6; the checkpoint was at step 4: the resumed process logs steps 6 (again) and 9
    again = Tracker(cfg, enabled=True, run_dir=tmp_path / "run")
    assert again.start(run_id, {"stage": "x"}) == run_id
    again.metrics({"train_loss": 0.6, "valid_loss": 1.5}, 6)
    again.metrics({"train_loss": 0.9}, 9)
    c = mlflow.MlflowClient(cfg.tracking.uri)
    history = lambda run, key: [(m.step, m.value) for m in sorted(c.get_metric_history(run, key),  # noqa: E731
                                                                  key=lambda m: m.step)]
    assert history(run_id, "train_loss") == [(3, 0.3), (6, 0.6), (9, 0.9)]
    assert history(run_id, "valid_loss") == [(6, 1.5)]
    # a rollback to the step-3 checkpoint (or a changed config): what follows step 3 is a new timeline, logged
    rollback = Tracker(cfg, enabled=True, run_dir=tmp_path / "run")
    rollback.new_timeline_after(3)
    rollback.start(run_id, {"stage": "x"})
    rollback.metrics({"train_loss": 0.55}, 6)
    assert history(run_id, "train_loss") == [(3, 0.3), (6, 0.6), (6, 0.55), (9, 0.9)]
    fresh = Tracker(cfg, enabled=True, run_dir=tmp_path / "run")
    other = fresh.start(None, {"stage": "x"})
    fresh.metrics({"train_loss": 0.1}, 3)
    assert other != run_id and history(other, "train_loss") == [(3, 0.1)]


def test_a_record_that_cannot_be_written_does_not_stop_the_run(tmp_path, monkeypatch, caplog):
    """A full disk under the run directory: the metric is still logged, one warning says a resume may log some
    steps twice, and rank 0 does not stop alone (the other ranks would wait for it in a collective)."""
    import errno
    import logging

    import mlflow

    from conftest import seed_store
    from hibert.config import Config
    from hibert.runtime.tracking import Tracker

    seed_store(tmp_path / "mlflow.db")
    cfg = Config()
    cfg.run.output_dir, cfg.tracking.uri = str(tmp_path), f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(cfg, enabled=True, run_dir=tmp_path / "run")
    run_id = tracker.start(None, {"stage": "x"})
    real_replace = Path.replace

    def full(self, target):
        if Path(target).name == "logged_steps.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", full)
    with caplog.at_level(logging.WARNING):
        tracker.metrics({"train_loss": 1.0}, 1)
        tracker.metrics({"train_loss": 0.9}, 2)
    assert [m.step for m in mlflow.MlflowClient(cfg.tracking.uri).get_metric_history(run_id, "train_loss")] == [1, 2]
    assert sum("cannot record the logged steps" in r.getMessage() for r in caplog.records) == 1


def test_mlflows_store_errors_are_one_line_each_without_tracebacks(capfd, monkeypatch):
    """MLflow's SQL store logs every failed write with its traceback before raising it (a full disk under a sqlite
    store: ~40 lines per write): one line per distinct database error instead; DEBUG keeps the tracebacks."""
    import logging
    import sqlite3

    import sqlalchemy.exc

    from hibert.logs import LEVEL_ENV, MLFLOW_STORE_LOGGER, setup_logging

    store = logging.getLogger(MLFLOW_STORE_LOGGER)

    def fail(n: int) -> None:
        for _ in range(n):
            try:
                raise sqlalchemy.exc.OperationalError("INSERT INTO metrics", {}, sqlite3.OperationalError(
                    "database or disk is full"))
            except sqlalchemy.exc.OperationalError as e:
                store.exception("SQLAlchemy database error. The following exception is caught.\n%s", e)

    monkeypatch.delenv(LEVEL_ENV, raising=False)
    try:
        setup_logging(0)
        fail(5)
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and "database or disk is full" in err and "Traceback" not in err, err
        monkeypatch.setenv(LEVEL_ENV, "DEBUG")
        setup_logging(0)
        fail(1)
        assert "Traceback" in capfd.readouterr().err
    finally:
        monkeypatch.undo()
        setup_logging(0)


def test_the_model_cache_keeps_only_complete_downloads(tmp_path, monkeypatch):
    """A version whose artifacts are gone downloads as an empty folder (MLflow logs it, raises nothing): one line
    naming the reference, and nothing cached, so a later call downloads again; a complete download is cached
    once and read from the cache afterwards."""
    import mlflow

    from hibert.registry import _cached_download

    monkeypatch.setenv("HIBERT_CACHE", str(tmp_path / "cache"))
    calls = []

    def download(artifact_uri, dst_path, **_):
        calls.append(artifact_uri)
        if len(calls) > 1:   # the artifacts are back
            (Path(dst_path) / "export.json").write_text("{}")
        return dst_path

    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", download)
    with pytest.raises(UserError, match=r"models:/m/1.*its files did not download \(no file\)"):
        _cached_download("models:/m/1", "sqlite:////x.db", "m", "1-abc-1")
    assert not list((tmp_path / "cache").rglob("*.json")) and not list((tmp_path / "cache").rglob("*.partial"))
    first = _cached_download("models:/m/1", "sqlite:////x.db", "m", "1-abc-1")
    assert (first / "export.json").is_file()
    assert _cached_download("models:/m/1", "sqlite:////x.db", "m", "1-abc-1") == first and len(calls) == 2
