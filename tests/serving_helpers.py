"""`mlflow models serve` of a registered model for the serving tests: started on a free loopback port in its own
process group, waited for, stopped (the whole group) at the end."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

MLFLOW = [sys.executable, "-m", "mlflow"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tracking_server(root: Path, port: int) -> subprocess.Popen:
    """`mlflow server` on loopback with its own store under `root`; returns once /health answers. Stop it
    with `kill_group` (it runs in its own session, workers included)."""
    root.mkdir(exist_ok=True)
    mlflow = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(mlflow), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=open(root / "server.log", "a"), stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.time()
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return proc
        except OSError:
            assert proc.poll() is None, (root / "server.log").read_text()[-2000:]
            assert time.time() - t0 < 90, "mlflow server did not start in 90 s"
            time.sleep(0.3)


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@contextlib.contextmanager
def served(model_uri: str, tracking_uri: str, log: Path, timeout: float = 180, hibert: bool = False,
           extra: tuple[str, ...] = ()):
    """Yields the server's base URL once /ping answers 200: `mlflow models serve`, or `hibert serve` (`extra`: its
    flags)."""
    port = free_port()
    # the server execs `uvicorn` by name: the venv's bin first on PATH, as an activated venv has it
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_REGISTRY_URI": tracking_uri,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    with open(log, "w") as out:
        command = ([sys.executable, "-m", "hibert.cli", "serve", model_uri, "--port", str(port), *extra] if hibert
                   else [*MLFLOW, "models", "serve", "-m", model_uri, "--env-manager", "local", "-h", "127.0.0.1",
                         "-p", str(port), "-w", "1"])
        proc = subprocess.Popen(command, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{command[2:4]} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.time() > deadline:
                raise AssertionError(f"mlflow models serve did not answer in {timeout} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def invoke(url: str, payload: dict | bytes, content_type: str = "application/json") -> tuple[int, dict | str]:
    """POST /invocations: (status, parsed JSON body or raw text)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    req = urllib.request.Request(f"{url}/invocations", data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            status, raw = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read().decode()
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw


@contextlib.contextmanager
def mlflow_store(uri: str, monkeypatch):
    """MLflow's in-process tracking and registry URIs pointed at `uri` (what `models:/` resolves against), and
    put back at the end: the globals to None (MLflow's default), the variables MLflow exports by monkeypatch."""
    import mlflow

    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        monkeypatch.setenv(var, uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
