"""The pyfunc loader MLflow imports for a finetuned export (the `loader_module` its MLmodel names):
`mlflow.pyfunc.load_model("models:/hibert-abstractive@finetuned").predict(df, params={...})` and
`mlflow models serve` both end here.

Input: a DataFrame with a `text` column (documents heads) or a `documents` column of string lists (a
multi-document head), and an optional `id` column. Params: the decoding settings under the CLI flags' names
(beam, min_len, max_len, length_penalty, no_repeat_ngram, max_word_pieces, batch_size; `k` of an extract): a
head's inference settings under its flags' names (finetune/inference/flags.py), checked as the flags are. Output: one row per input with `id`, `summary` (its sentences),
`num_sentences`, `note` (and `indices` for extractive picks, `subwords` for abstracts) — what `hibert
summarize --json` prints for the same text. Bad input raises MlflowException(INVALID_PARAMETER_VALUE), which
the scoring server answers with 400 and the message.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from hibert.config import Config
from hibert.finetune.inference.flags import (
    SettingError,
    check_flags,
    flags_as_params,
    params_to_flags,
    refuse_foreign,
    resolve_settings,
)
from hibert.finetune.inference.fluency import fluency_note
from hibert.finetune.inference.text import InputError, check_length, max_doc_chars
from hibert.finetune.settings import SummarizeSettings
from hibert.heads import head_of_export

log = logging.getLogger("hibert.serving")
# documents a server decodes together at most, whatever a request asks: the decoding state of one document of
# HIBERT_M is ~30 MB, so a client must not choose it. An operator raises it (a GPU server wants hundreds) through
# the model's config: `load_model(uri, model_config={"max_batch_size": N})`, or for `mlflow models serve`
# MLFLOW_PYFUNC_INFERENCE_CONFIG='{"max_batch_size": N}' (MLflow's own override of a flavor's model_config).
SERVING_MAX_BATCH = 16
# rows one request may hold (model_config max_rows): a request's memory is bounded by the server, not the client
SERVING_MAX_ROWS = 256
# MLflow's scoring server answers 504 after this many seconds (its MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT) but
# leaves the worker computing: predict stops at the next batch once the deadline has passed
REQUEST_TIMEOUT_ENV = "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT"


class ServingError(MlflowException):
    """A request refused with our message. MLflow's scoring server prefixes a predict error's message with the
    whole input ("Failed to predict data '<the DataFrame>'. Error: ...", mlflow/pyfunc/scoring_server); this
    message keeps only what follows, so a 400's body says what was wrong and not a dump of the request."""
    _PREFIX = "Failed to predict data '"

    @property
    def message(self) -> str:
        return self._message

    @message.setter
    def message(self, value: str) -> None:
        value = str(value)
        if value.startswith(self._PREFIX) and "\nError: " in value:
            value = value.rsplit("\nError: ", 1)[1]
        self._message = value


def _bad(message: str) -> MlflowException:
    return ServingError(message, error_code=INVALID_PARAMETER_VALUE)


def _max_batch(value: Any, key: str = "max_batch_size", default: int = SERVING_MAX_BATCH) -> int:
    """A server bound from model_config (max_batch_size: documents decoded together; max_rows: rows a request
    may hold); None: the default."""
    if value is None:
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = None
    if n is None or isinstance(value, bool) or n != value and str(n) != str(value).strip():
        raise _bad(f"model_config {key} {value!r}: must be a whole number of documents")
    if n < 1:
        raise _bad(f"model_config {key} {value!r}: must be >= 1")
    return n


def _request_timeout() -> float:
    try:
        return max(1.0, float(os.environ.get(REQUEST_TIMEOUT_ENV, "60")))
    except ValueError:
        return 60.0


class HibertPyfunc:
    """One loaded export; `predict` never changes its state (a server may call it from several threads)."""
    # the server's bounds (model_config overrides them in __init__)
    max_batch_size: int = SERVING_MAX_BATCH
    max_rows: int = SERVING_MAX_ROWS
    timeout_s: float = 60.0

    def __init__(self, export_dir: str | Path, stanza_dir: str | None = None, device: str | None = None,
                 max_batch_size: int | None = None, max_rows: int | None = None):
        self.export_dir = Path(export_dir)
        self.max_batch_size = _max_batch(max_batch_size)
        self.max_rows = _max_batch(max_rows, "max_rows", SERVING_MAX_ROWS)
        self.timeout_s = _request_timeout()
        self.head = head_of_export(self.export_dir)
        if self.head.summarizer is None:
            raise _bad(f"a {self.head.name} model does not summarize; it has no pyfunc predict")
        self.clusters = self.head.reads == "clusters"
        self.max_chars = max_doc_chars(self.export_dir)
        cfg = Config()
        cfg.data.segmenter.stanza_dir = stanza_dir
        # a learned ranker of an mds model resolves through $MLFLOW_TRACKING_URI into a scratch directory
        self._scratch = tempfile.TemporaryDirectory(prefix="hibert-pyfunc-")   # removed with this object
        cfg.run.output_dir = self._scratch.name
        own = resolve_settings(self.head, self.export_dir, {})
        # the model's own batch size: MLflow fills a param a request leaves out with the signature's default
        self.default_batch = getattr(own, "batch_size", None)
        self.settings = self._bounded(own, None) if own is not None else None
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.summarizer = self.head.summarizer(cfg, self.export_dir, device, self.settings, SummarizeSettings())
        # the model's own state ("cannot write yet"): in every answer's note, not only in the server's log
        self.model_note = fluency_note(self.export_dir) if self.head.decodes else None
        if self.model_note:
            log.warning("%s", self.model_note)

    # ---------------------------------------------------------------------------------------------- input
    def _rows(self, model_input) -> list[tuple[str, Any]]:
        df = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        column = "documents" if self.clusters else "text"
        if column not in df.columns:
            other = "text" if self.clusters else "documents"
            hint = (f" (a {other!r} column is for a {'documents' if self.clusters else 'multi-document'} model)"
                    if other in df.columns else "")
            raise _bad(f"input has no {column!r} column (columns: {', '.join(map(str, df.columns)) or 'none'})"
                       f"{hint}")
        if len(df) > self.max_rows:
            raise _bad(f"{len(df)} rows: this server takes at most {self.max_rows} per request (its model_config "
                       "max_rows); send them in several requests")
        ids = df["id"].tolist() if "id" in df.columns else [None] * len(df)
        rows = []
        for n, (doc_id, value) in enumerate(zip(ids, df[column].tolist()), 1):
            name = str(doc_id) if doc_id is not None and doc_id == doc_id else str(n)
            where = f"row {n} (id {name})"
            if self.clusters:
                docs = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
                if not docs or not all(isinstance(d, str) for d in docs):
                    raise _bad(f"{where}: 'documents' must be a non-empty list of strings")
                if not any(d.strip() for d in docs):
                    raise _bad(f"{where}: every document of the cluster is empty, nothing to summarize")
                body: Any = docs
            else:
                if not isinstance(value, str):
                    raise _bad(f"{where}: 'text' must be a string, not {type(value).__name__}")
                if not value.strip():
                    raise _bad(f"{where}: 'text' is empty, nothing to summarize")
                body = value
            try:
                for k, text in enumerate(body if self.clusters else [body]):
                    check_length(text, f"{where} (document {k + 1})" if self.clusters else where, self.max_chars)
            except InputError as e:
                raise _bad(str(e)) from None
            rows.append((name, body))
        return rows

    def _overrides(self, params: dict[str, Any] | None) -> dict[str, Any]:
        """params -> the summarizer's settings for this call, checked as the CLI's flags are (messages name the
        params); none: the head takes no settings."""
        if self.settings is None and not params:
            return {}
        try:
            given = params_to_flags(self.head, dict(params or {}))
            refuse_foreign(self.head, given)   # before the bounds: "does not apply" says more than "must be >= 1"
            check_flags(given)
            resolved = resolve_settings(self.head, self.export_dir, given) if given else self.settings
        except SettingError as e:
            raise _bad(flags_as_params(str(e), self.head)) from None
        return {"settings": self._bounded(resolved, (params or {}).get("batch_size"))}

    def _bounded(self, settings, requested: Any):
        """The server, not its clients, bounds the memory of a request: a batch_size asked for above the server's
        max_batch_size is refused; the model's own default above it is lowered to it (outputs do not depend on
        the batch)."""
        if getattr(settings, "batch_size", None) is None or settings.batch_size <= self.max_batch_size:
            return settings
        if requested is not None and int(requested) != self.default_batch:
            raise _bad(f"params.batch_size {requested}: this server decodes at most {self.max_batch_size} documents "
                       "together (its model_config max_batch_size)")
        return settings.model_copy(update={"batch_size": self.max_batch_size})

    # ---------------------------------------------------------------------------------------------- predict
    def predict(self, model_input, params: dict[str, Any] | None = None):
        rows = self._rows(model_input)
        overrides = self._overrides(params)
        deadline = time.monotonic() + self.timeout_s
        summaries = []
        try:
            for i in range(0, len(rows), self.max_batch_size):   # outputs do not depend on the batch
                if i and time.monotonic() > deadline:   # the client has its 504 already: stop computing for it
                    raise _bad(f"the request ran past the server's {self.timeout_s:.0f} s ({REQUEST_TIMEOUT_ENV}) "
                               f"after {i} of {len(rows)} rows; send fewer rows per request")
                summaries += self.summarizer.summarize_all(rows[i:i + self.max_batch_size], **overrides)
        except InputError as e:
            raise _bad(str(e)) from None
        out = [s.record(self.clusters, self.model_note) for s in summaries]   # what `hibert summarize --json` prints
        return pd.DataFrame(out, columns=["id", "summary", "num_sentences", "note"] if not out else None)


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> HibertPyfunc:
    """MLflow's entry point: `data_path` is the model directory (the export). `model_config` may set
    `stanza_dir` (a neural segmenter's models), `device`, `max_batch_size` (documents decoded together at
    most, whatever a request's params.batch_size; default SERVING_MAX_BATCH) and `max_rows` (rows a request may
    hold; default SERVING_MAX_ROWS)."""
    model_config = model_config or {}
    return HibertPyfunc(data_path, model_config.get("stanza_dir"), model_config.get("device"),
                        model_config.get("max_batch_size"), model_config.get("max_rows"))
