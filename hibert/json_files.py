"""An export's JSON settings files (export.json, a head's settings), read without torch: a damaged file is one
`UserError` / `ValueError` line naming it, worded as the config loader words its errors."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hibert.config.load import format_validation_error
from hibert.errors import UserError

DAMAGED = "export it again, or fetch it again from the registry"


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object file of an export; anything else is one `UserError` line naming it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is unreadable or not JSON ({str(e)[:200]}): {DAMAGED}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a JSON {type(data).__name__}, not an object: {DAMAGED}")
    return data


def validated(schema, data, path: Path):
    """`schema.model_validate(data)`, its errors as the config loader words them (one line for one problem)."""
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise ValueError(format_validation_error(e, str(path))) from None
