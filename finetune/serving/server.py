"""`hibert serve MODEL`: MLflow's own scoring server for a finetuned model (the same /invocations, /ping,
/health and /version, the same pyfunc, what `mlflow models serve --env-manager local` runs), behind a guard for
the requests MLflow answers badly:

- a body above `--max-body-mb` is a 413 before it is read further (MLflow reads any size);
- JSON that does not parse, is nested deeper than `MAX_DEPTH`, is not an object, holds no rows, or gives a param a
  value of the wrong type is a 400 naming what is wrong in one line — never an echo of the body (MLflow puts the
  whole malformed body, or the DataFrame, into its message) and never a 500 (a 100,000-deep array exhausts
  Python's recursion in MLflow's parser);
- any other error body keeps MLflow's status, its prefix ("Failed to predict data '<DataFrame>'") removed and its
  message cut at `MESSAGE_CHARS`.

The pyfunc's own checks (bounds, params of another head, an empty or oversized document, rows per request) are
unchanged behind it. Imports of MLflow, FastAPI and uvicorn are lazy: `hibert --help` stays fast."""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

MAX_BODY_MB = 16          # a request's rows are bounded by the pyfunc (max_batch_size); this bounds its bytes
MAX_DEPTH = 32            # a dataframe_records request is 3 levels deep; params are flat
MESSAGE_CHARS = 2000
DATA_KEYS = ("dataframe_records", "dataframe_split", "instances", "inputs")
_TYPES = {"long": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
          "integer": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
          "double": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
          "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
          "boolean": (lambda v: isinstance(v, bool), "true or false"),
          "string": (lambda v: isinstance(v, str), "a string")}
_MLFLOW_PREFIX = "Failed to predict data '"
ENV_MODEL, ENV_MAX_BODY = "HIBERT_SERVE_MODEL", "HIBERT_SERVE_MAX_BODY_MB"

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


def _short(value: Any, n: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= n else text[:n] + "..."


def _depth(obj: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def _rows(request: dict[str, Any]) -> str | None:
    """Why a request's data holds no rows, or None."""
    keys = [k for k in DATA_KEYS if k in request]
    if len(keys) != 1:
        return (f"the request must hold one of {', '.join(DATA_KEYS)}" if not keys
                else f"the request holds {' and '.join(keys)}: give one")
    data = request[keys[0]]
    if keys[0] == "dataframe_split":
        data = data.get("data") if isinstance(data, dict) else None
    if isinstance(data, dict):   # `inputs` / `instances` as columns
        data = next(iter(data.values()), None)
    if not isinstance(data, list):
        return f"{keys[0]} must be a list of rows"
    return f"{keys[0]} is empty: the request holds no document" if not data else None


def check_request(body: bytes, params: dict[str, str]) -> str | None:
    """The one-line reason a JSON /invocations body is refused (400), or None to pass it on. `params`: the
    signature's param name -> MLflow type."""
    try:
        request = json.loads(body)
    except RecursionError:
        return f"the request's JSON is nested too deep to parse (at most {MAX_DEPTH} levels)"
    except UnicodeDecodeError as e:
        return f"the request is not UTF-8 (byte {e.start})"
    except json.JSONDecodeError as e:
        return f"the request is not JSON: {e.msg} at line {e.lineno} column {e.colno}"
    if _depth(request) > MAX_DEPTH:
        return f"the request's JSON is nested more than {MAX_DEPTH} levels deep"
    if not isinstance(request, dict):
        return f"the request must be a JSON object with one of {', '.join(DATA_KEYS)}"
    if (why := _rows(request)) is not None:
        return why
    given = request.get("params", {})
    if not isinstance(given, dict):
        return f"params must be an object of name: value, not {type(given).__name__}"
    for name, value in given.items():
        kind = params.get(name)
        if kind in _TYPES and not _TYPES[kind][0](value):
            return f"params.{name} {_short(value)}: must be {_TYPES[kind][1]}"
    return None


def clean_message(message: str) -> str:
    """MLflow's error message without its dump of the request, cut to MESSAGE_CHARS."""
    if message.startswith(_MLFLOW_PREFIX) and "\nError: " in message:
        message = message.split("\nError: ", 1)[1]
    return message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS] + " [cut]"


def _error_body(status: int, message: str) -> bytes:
    code = "REQUEST_TOO_LARGE" if status == 413 else "BAD_REQUEST"
    return json.dumps({"error_code": code, "message": message}).encode()


class Guard:
    """ASGI middleware around MLflow's scoring app (see the module's docstring)."""

    def __init__(self, app: ASGIApp, params: dict[str, str], max_body_bytes: int):
        self.app, self.params, self.max_body = app, params, max_body_bytes

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != "/invocations" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"").decode() or None
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return await self._answer(send, 413, self._too_large(int(declared)))
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                return await self._answer(send, 413, self._too_large(None))
        if headers.get(b"content-type", b"").split(b";")[0].strip() == b"application/json":
            if (why := check_request(body, self.params)) is not None:
                return await self._answer(send, 400, why)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, _ErrorRewriter(send))

    def _too_large(self, size: int | None) -> str:
        got = f"{size:,} bytes" if size is not None else "more"
        return (f"the request body is {got}: this server takes at most {self.max_body:,} "
                "(hibert serve --max-body-mb)")

    @staticmethod
    async def _answer(send, status: int, message: str) -> None:
        body = _error_body(status, message)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _ErrorRewriter:
    """Passes a success through untouched; an error's JSON body is buffered and its message cleaned."""

    def __init__(self, send):
        self.send, self.start, self.chunks = send, None, []

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            if message["status"] < 400:
                self.start = False
                return await self.send(message)
            self.start = message
            return
        if self.start is False or message["type"] != "http.response.body":
            return await self.send(message)
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        raw = b"".join(self.chunks)
        try:
            obj = json.loads(raw)
            obj = {"error_code": obj.get("error_code", "BAD_REQUEST"), "message": clean_message(str(obj["message"]))}
            raw = json.dumps(obj).encode()
        except (ValueError, KeyError, TypeError, AttributeError):   # not MLflow's JSON error: cut, as text
            raw = clean_message(raw.decode(errors="replace")).encode()
        headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
        await self.send({**self.start, "headers": [*headers, (b"content-length", str(len(raw)).encode())]})
        await self.send({"type": "http.response.body", "body": raw})


def param_types(model) -> dict[str, str]:
    """The model signature's param name -> MLflow type name."""
    schema = model.metadata.get_params_schema()
    return {p.name: p.dtype.name for p in schema.params} if schema else {}


def create_app(model_uri: str | None = None, max_body_mb: float | None = None) -> ASGIApp:
    """MLflow's scoring app for `model_uri` (default: $HIBERT_SERVE_MODEL, as uvicorn's workers get it) behind the
    guard."""
    import mlflow.pyfunc
    from mlflow.pyfunc import scoring_server

    model = mlflow.pyfunc.load_model(model_uri or os.environ[ENV_MODEL])
    mb = max_body_mb if max_body_mb is not None else float(os.environ.get(ENV_MAX_BODY, MAX_BODY_MB))
    return Guard(scoring_server.init(model), param_types(model), int(mb * 2**20))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="models:/NAME@ALIAS (or /VERSION), an export folder, or any MLflow model URI")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=5001)
    p.add_argument("--workers", type=int, default=1, help="server processes, each with its own copy of the model")
    p.add_argument("--max-body-mb", type=float, default=MAX_BODY_MB,
                   help=f"largest request body in MiB (default {MAX_BODY_MB}); a larger one is a 413")


def run(args: argparse.Namespace) -> int:
    from hibert.errors import UserError

    if args.workers < 1 or args.max_body_mb <= 0 or not 0 < args.port < 65536:
        raise UserError("hibert serve: --workers >= 1, --max-body-mb > 0 and a port in 1..65535")
    import uvicorn

    from mlflow.exceptions import MlflowException

    os.environ[ENV_MODEL], os.environ[ENV_MAX_BODY] = args.model, str(args.max_body_mb)
    try:   # loaded here first: a model that cannot be served fails before the port opens, in one line
        app = create_app()
    except (MlflowException, OSError) as e:
        raise UserError(f"hibert serve: cannot load {args.model}: {str(e).splitlines()[0][:500]}") from None
    # one worker serves the model loaded above; more are processes of their own, each loading it from the URI
    uvicorn.run(app if args.workers == 1 else "hibert.finetune.serving.server:create_app",
                factory=args.workers > 1, host=args.host, port=args.port, workers=args.workers, log_level="info")
    return 0
