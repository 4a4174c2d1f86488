"""How an extractive export picks sentences (extractive.json), read without loading any weights: the
extractive head's `Inference` (hibert/heads.py)."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from hibert.config.base import Section, flag
from hibert.json_files import read_json_object, validated

SELECTION_FILE = "extractive.json"
TUNING_FILE = "selection_tuning.json"   # how extractive.json was chosen (written beside it at export)


class ExtractiveSelection(Section):
    """The top `top_k` sentences by score, in document order (HIBERT §4.2), optionally with trigram blocking."""
    top_k: int = Field(3, ge=1, json_schema_extra=flag("--k", "sentences to extract (default: the model's, "
                                                       "as it is served)", commands=("summarize", "evaluate")))
    trigram_blocking: bool = False


def stored_selection(export_dir: Path) -> ExtractiveSelection:
    """The selection an export was written with (the defaults when it has no extractive.json)."""
    path = Path(export_dir) / SELECTION_FILE
    return validated(ExtractiveSelection, read_json_object(path), path) if path.is_file() else ExtractiveSelection()


def selection_provenance(export_dir: Path) -> dict | None:
    """selection_tuning.json of an export (None for an export written before it existed)."""
    path = Path(export_dir) / TUNING_FILE
    return read_json_object(path) if path.is_file() else None


def selection_note(selection: ExtractiveSelection, provenance: dict | None, given: bool) -> str:
    """One sentence: which selection a report scored and whether it is the one the model is served with."""
    what = f"top {selection.top_k} sentences" + (", trigram blocking" if selection.trigram_blocking else "")
    if given:
        return f"selection: {what}, as given on the command line (not the model's own: see extractive.json)"
    if provenance and provenance.get("tuned"):
        return (f"selection: {what}: the model's own (extractive.json), tuned on its training data's validation "
                f"split ({provenance.get('documents')} documents, mean ROUGE-1/2/L F1) when it was exported; "
                "`hibert summarize` and the served model use the same")
    return (f"selection: {what}: the model's own (extractive.json, not tuned); `hibert summarize` and the "
            "served model use the same")
