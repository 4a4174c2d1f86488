"""Reading the JSON settings files of an export: a damaged file is one `ValueError` line naming it, worded
as the config loader words its errors."""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from hibert.config.load import format_validation_error


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None


def _validated(schema, data, path: Path):
    """`schema.model_validate(data)`, its errors as the config loader words them (one line for one problem)."""
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise ValueError(format_validation_error(e, str(path))) from None
