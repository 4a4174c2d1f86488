"""How an extractive export picks sentences (extractive.json), read without loading any weights: the
extractive head's `Inference` (hibert/heads.py)."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from hibert.config.base import Section, flag
from hibert.json_files import read_json_object, validated

SELECTION_FILE = "extractive.json"


class ExtractiveSelection(Section):
    """The top `top_k` sentences by score, in document order (HIBERT §4.2), optionally with trigram blocking."""
    top_k: int = Field(3, ge=1, json_schema_extra=flag("--k", "sentences to extract (default: the model's)",
                                                       commands=("summarize",)))
    trigram_blocking: bool = False


def stored_selection(export_dir: Path) -> ExtractiveSelection:
    """The selection an export was written with (the defaults when it has no extractive.json)."""
    path = Path(export_dir) / SELECTION_FILE
    return validated(ExtractiveSelection, read_json_object(path), path) if path.is_file() else ExtractiveSelection()
