"""MLflow tracking URI resolution and the model registry (encoders of each stage, finetuned models).

Weights are stored as safetensors + config JSON run artifacts and registered from there: pickle-free,
and `models:/hibert-encoder@in-domain` resolves to a local directory that any command can load.
"""
from __future__ import annotations

import base64
import json
import os
import re
import sqlite3
import time
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Any

from hibert.errors import UserError, free_mb
from hibert.redact import redact_uri

try:
    import certifi  # what requests verifies against, not the system's store
except ImportError:
    certifi = None

DEFAULT_DB = "mlflow.db"


def tracking_uri(configured: str | None, output_dir: str | Path = "runs", create: bool = True) -> str:
    """Config value, else $MLFLOW_TRACKING_URI, else a local sqlite file under the output dir.

    `create=True` (training: the run is about to write there) makes the default store's directory;
    readers that must leave the disk alone (`hibert registry list|show`) pass `create=False`."""
    if configured:
        return configured
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    db = Path(output_dir).resolve() / DEFAULT_DB
    if create:
        db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (None for servers and other databases, and for
    in-memory sqlite). MLflow creates that file, and its tables, as soon as a client touches it."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


# MLflow's own HTTP policy retries an unreachable server for minutes (7 retries, exponential backoff, a 120 s
# timeout per request: `hibert registry list` on a dead port took 252 s). Ours is bounded; a user's own
# MLFLOW_HTTP_REQUEST_* settings win.
HTTP_POLICY = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
REACH_TIMEOUT_S = 5.0


def bound_http_retries() -> None:
    """Our retry policy for this process and every rank it starts (they inherit the environment)."""
    for key, value in HTTP_POLICY.items():
        os.environ.setdefault(key, value)


def _ssl_context() -> Any:
    """The TLS verification MLflow's own client applies (requests with `verify=`): a CA bundle named by
    MLFLOW_TRACKING_SERVER_CERT_PATH, else none with MLFLOW_TRACKING_INSECURE_TLS, else REQUESTS_CA_BUNDLE /
    CURL_CA_BUNDLE, else certifi's (requests' default); and a client certificate (MLFLOW_TRACKING_CLIENT_CERT_PATH). Without it
    a server behind an internal CA would be reported unreachable although MLflow reaches it."""
    import ssl  # lazy: ~4 ms on every command (hibert.cli imports this module); only https tracking needs it

    env = os.environ.get
    insecure = (env("MLFLOW_TRACKING_INSECURE_TLS") or "").strip().lower() in ("true", "1")
    bundle = env("MLFLOW_TRACKING_SERVER_CERT_PATH") or (
        None if insecure else env("REQUESTS_CA_BUNDLE") or env("CURL_CA_BUNDLE"))
    if bundle:
        ctx = ssl.create_default_context(**({"capath": bundle} if os.path.isdir(bundle) else {"cafile": bundle}))
    elif insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(cafile=certifi.where() if certifi is not None else None)
    if env("MLFLOW_TRACKING_CLIENT_CERT_PATH"):
        ctx.load_cert_chain(env("MLFLOW_TRACKING_CLIENT_CERT_PATH"))
    return ctx


_API_PROBE = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"


def _probe(uri: str, timeout: float) -> str | None:
    """None when an http(s) MLflow tracking server answers a REST call within `timeout` seconds, else why not.
    JSON counts, an experiment or an MLflow error (a 404 for a missing experiment is MLflow's answer), and so
    does 401/403 (authentication in front of it); a 5xx is a proxy or gateway whose backend is down, so
    unreachable; a page that is not JSON is another server. Other stores: None. A URI that cannot be parsed is a
    `UserError`, password masked."""
    if not uri.startswith(("http://", "https://")):
        return None
    from urllib.request import Request, urlopen  # lazy: ~8 ms (http.client, ssl) on every command; http(s) only

    try:
        parts = urllib.parse.urlsplit(uri)
        port = parts.port
    except ValueError as e:   # a port out of range or not a number, an unclosed [IPv6 literal
        raise UserError(f"tracking URI {redact_uri(uri)} is malformed ({redact_uri(str(e))}): fix tracking.uri / "
                        "$MLFLOW_TRACKING_URI") from None
    headers = {}
    if parts.username is not None:  # urllib does not read userinfo: send it as basic auth, as MLflow would
        token = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{port}" if port else ""
    # an MLflow REST call (GET): MLflow answers JSON, an experiment or a JSON error; another web server on the
    # port (a proxy's page, `python -m http.server`) does not, and would fail later inside every rank
    url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + _API_PROBE, "", ""))
    try:
        ctx = _ssl_context() if parts.scheme == "https" else None
        with urlopen(Request(url, headers=headers), timeout=timeout, context=ctx) as r:
            status, body = r.status, r.read(65536)
    except urllib.error.HTTPError as e:
        if e.code >= 500:
            return f"HTTP {e.code} {e.reason}"
        if e.code in (401, 403):   # an MLflow behind authentication: live, the credentials are MLflow's problem
            return None
        status, body = e.code, e.read(65536)
    except (urllib.error.URLError, OSError, ValueError) as e:
        return str(getattr(e, "reason", e))
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return (f"it answers HTTP {status} but is not an MLflow tracking server (GET {_API_PROBE.split('?')[0]} "
                "gave no JSON)")
    return None


def reachable(uri: str, timeout: float = 2.0) -> bool:
    """Whether the tracking server answers now (a quick probe: training calls it while a server is away)."""
    return _probe(uri, timeout) is None


def check_reachable(uri: str, timeout: float = REACH_TIMEOUT_S) -> None:
    """An http(s) tracking server answers within `timeout` seconds, or one `UserError` line naming it,
    password masked. Other stores: nothing to check."""
    t0 = time.monotonic()
    reason = _probe(uri, timeout)
    if reason is not None and reason.startswith("it answers"):
        raise UserError(f"tracking URI {redact_uri(uri)}: {reason}: fix tracking.uri / $MLFLOW_TRACKING_URI")
    if reason is not None:
        # the time the probe took (a refused connection fails at once), not the timeout it was allowed
        took = time.monotonic() - t0
        raise UserError(f"tracking server {redact_uri(uri)} is unreachable ({redact_uri(reason)[:200]}; "
                        f"probed for {took:.1f} s of at most {timeout:.0f} s before starting): start it, or fix "
                        "tracking.uri / $MLFLOW_TRACKING_URI (unset both for the local store under run.output_dir)")


def client(uri: str) -> Any:
    """A client bound to `uri`, without touching MLflow's global state."""
    from mlflow.tracking import MlflowClient  # lazy: ~1.0 s, which --help, prep and config printing never need

    # MLflow prints "View run ... at: <tracking URI>/#/..." to stdout whenever a run on a server ends, the URI's
    # user:password@ included: every job log would hold the password (the run's id is in our own log lines)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def activate(uri: str) -> None:
    """Point MLflow's fluent API (start_run, log_*) at `uri` for this process. MLflow also exports it
    as $MLFLOW_TRACKING_URI, which child processes inherit: call it only in the process that logs."""
    import mlflow  # lazy: ~1.0 s, which every importer of this module that does not log would pay

    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)


def artifact_location(uri: str) -> str | None:
    """Artifacts of a local sqlite store live next to it (<dir>/mlartifacts), not in the working
    directory's ./mlruns (MLflow's default); a tracking server decides for itself (None)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
    return None


def check_store_location(uri: str, experiment: str) -> None:
    """A local sqlite store that was copied or moved still names the original directory as its experiment's
    artifact location (MLflow stores it absolute): logging there would write into the original. One
    `UserError` line instead, before anything is written. Read with sqlite3 directly (no MLflow import)."""
    db = sqlite_path(uri)
    expected = artifact_location(uri)
    if db is None or expected is None or not db.is_file():
        return
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            row = con.execute("SELECT artifact_location FROM experiments WHERE name = ?", (experiment,)).fetchone()
    except sqlite3.Error:
        return  # not an MLflow store we can read: MLflow will say what is wrong with it
    if row is None or not row[0]:
        return
    stored = row[0]
    path = lambda loc: Path(loc[len("file://"):] if loc.startswith("file://") else loc)  # noqa: E731
    if not path(stored).is_absolute() or path(stored).name != "mlartifacts":
        return  # not the layout this platform creates (a server's, or one made by hand): not ours to judge
    if path(stored).resolve() != path(expected).resolve():
        raise UserError(f"the MLflow store {db} was copied or moved: its experiment {experiment!r} writes artifacts "
                        f"to {stored}, not next to it; work in the original directory, or set "
                        "tracking.experiment=<a new name> to start an experiment here")


def ensure_experiment(uri: str, name: str) -> None:
    """Make `name` the active experiment of the fluent API, creating it with our artifact location."""
    import mlflow  # lazy: ~1.0 s, only the processes that log pay it

    activate(uri)
    if mlflow.get_experiment_by_name(name) is None:
        try:
            mlflow.create_experiment(name, artifact_location=artifact_location(uri))
        except Exception:  # created meanwhile by another process
            if mlflow.get_experiment_by_name(name) is None:
                raise
    mlflow.set_experiment(name)


# MLflow 3's UI opens an experiment of no declared kind on its GenAI "Traces" page, with the runs one tab away;
# this tag (read by the UI, values in its ExperimentKind enum) makes it open on the runs table
EXPERIMENT_KIND_TAG = ("mlflow.experimentKind", "custom_model_development")


def experiment_id(uri: str, name: str) -> str:
    """The id of experiment `name` in `uri`, created (with our artifact location and kind) if missing; an
    existing one without a kind gets ours. No global state."""
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is None:
        try:
            return c.create_experiment(name, artifact_location=artifact_location(uri), tags=dict([EXPERIMENT_KIND_TAG]))
        except Exception:  # created meanwhile by another process
            exp = c.get_experiment_by_name(name)
            if exp is None:
                raise
    if EXPERIMENT_KIND_TAG[0] not in (exp.tags or {}):   # made before the kind was set, or by MLflow itself
        c.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND_TAG)
    return exp.experiment_id


def register_artifact_dir(uri: str, run_id: str, artifact_path: str, name: str, alias: str | None,
                          tags: dict[str, str] | None = None, also: list[str] | tuple[str, ...] = (),
                          once: bool = False, description: str | None = None) -> str:
    """Register `runs:/<run_id>/<artifact_path>` as a new version of `name`; point `alias` (and `also`) at it.
    `once`: reuse a version of `name` this run already registered (a registration sent again after an outage:
    the first try may have reached the server)."""
    c = client(uri)
    try:
        c.get_registered_model(name)
    except Exception:
        c.create_registered_model(name)
    source = f"runs:/{run_id}/{artifact_path}"
    done = versions_where(c, name=name, run_id=run_id) if once else []
    mv = done[0] if done else c.create_model_version(name=name, source=source, run_id=run_id, tags=tags or {},
                                                     description=description)
    for a in dict.fromkeys([alias, *also]):
        if a:
            c.set_registered_model_alias(name, a, mv.version)
    return str(mv.version)


_MODELS_REF = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>[^/@]+))/?$")


def parse_models_ref(ref: str | None) -> tuple[str, str | None, str | None] | None:
    """`models:/name@alias` -> (name, alias, None); `models:/name/3` -> (name, None, "3"); else None. The one
    parser of registry references (the chain and `pin_model_ref` read them with it)."""
    m = _MODELS_REF.match(ref or "")
    return (m["name"], m["alias"], m["version"]) if m else None


def check_model_ref(ref: str, example: str = "models:/hibert-abstractive@finetuned") -> tuple[str, str | None, str | None]:
    """A registry reference's (name, alias, version), or one `UserError` line saying how to write it: the one check
    of its form (the launcher's `run.init` check and `resolve_model` both use it)."""
    parsed = parse_models_ref(ref)
    if parsed is None or (parsed[2] is not None and not parsed[2].isdigit()):
        raise UserError(f"model reference {ref!r}: write models:/<name>@<alias> or models:/<name>/<version number> "
                        f"(e.g. {example})")
    return parsed


def resolve_model(ref: str, uri: str, dst: str | Path | None = None) -> Path:
    """`models:/name@alias`, `models:/name/3` or a local directory -> local directory with the files. A
    reference that cannot resolve is one `UserError` line naming it and the store, and writes nothing: a
    malformed one, a sqlite store that does not exist (it is not created by looking), a missing model, alias or
    version."""
    if not ref.startswith("models:/"):
        path = Path(ref)
        if not path.is_dir():
            raise FileNotFoundError(f"model reference {ref!r} is neither models:/... nor a directory")
        return path
    parsed = check_model_ref(ref)
    check_reachable(uri)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise UserError(f"model reference {ref!r}: there is no registry at {db} (nothing was trained there); "
                        "name the store (tracking.uri=..., run.output_dir=...) or pass an export directory")
    import mlflow  # lazy: ~1.0 s, paid only when a models:/ reference is resolved
    from mlflow.exceptions import MlflowException

    # models:/ resolution builds clients from MLflow's global URI (default: ./mlflow.db), so set it
    activate(uri)
    # MLflow's per-file "Downloading artifacts" bar on every call says nothing a user needs: one line does
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    def fail(e: MlflowException) -> UserError:
        # MLflow's download failures put the cause on the lines after "The following failures occurred ..."
        lines = [line.strip() for line in str(e.message).splitlines() if line.strip()] or [type(e).__name__]
        reason = redact_uri(" ".join(lines[:2]))[:400]
        return UserError(f"model reference {ref!r} does not resolve in {redact_uri(uri)}: {reason} "
                         "(hibert registry list shows what is there)")

    try:
        if dst is not None:
            return Path(mlflow.artifacts.download_artifacts(artifact_uri=ref, dst_path=str(dst),
                                                            tracking_uri=uri, registry_uri=uri))
        name, key = _pinned_version(ref, parsed, uri)
        return _cached_download(f"models:/{name}/{key.split('-')[0]}", uri, name, key)
    except MlflowException as e:
        raise fail(e) from None


def model_cache() -> Path:
    """Where registered models are kept once downloaded: $HIBERT_CACHE, else $XDG_CACHE_HOME/hibert, else
    ~/.cache/hibert — one user-level place, never the working directory."""
    if os.environ.get("HIBERT_CACHE"):
        return Path(os.environ["HIBERT_CACHE"])
    try:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    except RuntimeError:   # no HOME and no passwd entry (some containers)
        raise UserError("no place for the model cache: set HIBERT_CACHE (or HOME) to a writable directory") from None
    return Path(base) / "hibert"


def _pinned_version(ref: str, parsed: tuple, uri: str) -> tuple[str, str]:
    """(name, "<version>-<its run id>"): an alias moves, so the cache is keyed by the version it points at now;
    a store made again at the same URI (`hibert demo --fresh`) numbers its versions from 1 again, so the key
    holds the run that made the version too."""
    name, alias, version = parsed
    c = client(uri)
    mv = c.get_model_version_by_alias(name, alias) if version is None else c.get_model_version(name, version)
    return name, f"{mv.version}-{(mv.run_id or 'norun')[:12]}-{mv.creation_timestamp}"


def _cached_download(ref: str, uri: str, name: str, key: str) -> Path:
    """A registered version's files in the model cache, downloaded once per (store, name, version): a version's
    files never change. Downloaded beside its place and renamed into it, so a cached directory is complete
    (two processes resolving at once each download; the first rename wins)."""
    import hashlib
    import shutil
    import tempfile

    import mlflow

    store = hashlib.sha256(uri.encode()).hexdigest()[:16]   # the raw URI: two stores never share a name
    place = model_cache() / "models" / store / _safe(name) / key
    if place.is_dir():
        return place
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
        part = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".partial", dir=place.parent))
    except OSError as e:
        raise UserError(f"cannot use the model cache {model_cache()} ({e.strerror or e}): set HIBERT_CACHE to a "
                        "writable directory") from None
    try:
        try:
            mlflow.artifacts.download_artifacts(artifact_uri=ref, dst_path=str(part), tracking_uri=uri,
                                                registry_uri=uri)
        except OSError as e:   # the cache's disk: full, or not writable
            raise UserError(f"cannot download {ref} into the model cache {place.parent} ({e.strerror or e}; "
                            f"{free_mb(place.parent)}): free space or set HIBERT_CACHE") from None
        # MLflow returns an empty folder (a log line, no error) for a version whose artifacts are gone: never
        # cache that, or every later call would read it
        if not (part / "export.json").is_file():
            raise UserError(f"model reference {ref!r} in {redact_uri(uri)}: its files did not download "
                            f"({', '.join(sorted(p.name for p in part.iterdir())[:5]) or 'no file'}): the version's "
                            "artifacts are missing from the store (hibert registry show)")
        try:
            part.rename(place)
        except OSError as e:
            if not place.is_dir():   # not another resolver's finished copy: a real failure
                raise UserError(f"cannot write the model cache {place} ({e.strerror or e}): set HIBERT_CACHE to a "
                                "writable directory") from None
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return place


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def pin_model_ref(ref: str, uri: str) -> str:
    """`models:/name@alias` -> `models:/name/<version it points at now>`; other references unchanged. What a
    run read is then recorded exactly, however the alias moves afterwards."""
    parsed = parse_models_ref(ref)
    if parsed is None or parsed[1] is None:
        return ref
    name, alias, _ = parsed
    return f"models:/{name}/{client(uri).get_model_version_by_alias(name, alias).version}"


def versions_where(c: Any, **equal: str) -> list[Any]:
    """search_model_versions for `key = value` clauses, each value quoted for MLflow's filter grammar (which has
    no escapes: a value holding ' is written in double quotes); a value holding both quotes cannot be written, so
    those clauses are applied here instead — one registered model named o'brien on a shared server must not
    break every listing."""
    clauses, here = [], {}
    for key, value in equal.items():
        if "'" not in value:
            clauses.append(f"{key}='{value}'")
        elif '"' not in value:
            clauses.append(f'{key}="{value}"')
        else:
            here[key] = value
    found = c.search_model_versions(" and ".join(clauses) if clauses else None)
    return [mv for mv in found if all(getattr(mv, k) == v for k, v in here.items())]


def list_versions(uri: str, name: str | None = None) -> list[dict[str, Any]]:
    c = client(uri)
    rows = []
    models = [c.get_registered_model(name)] if name else c.search_registered_models()
    for m in models:
        aliases_by_version: dict[str, list[str]] = {}
        for alias, version in (m.aliases or {}).items():
            aliases_by_version.setdefault(str(version), []).append(alias)
        for mv in versions_where(c, name=m.name):
            rows.append({"name": m.name, "version": str(mv.version),
                         "aliases": sorted(aliases_by_version.get(str(mv.version), [])),
                         "run_id": mv.run_id, "source": mv.source, "tags": dict(mv.tags or {}),
                         "created": mv.creation_timestamp})
    rows.sort(key=lambda r: (r["name"], int(r["version"])))
    return rows
