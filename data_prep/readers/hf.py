"""Hugging Face `datasets`: a dataset saved with `save_to_disk` (Dataset or DatasetDict) or local data
files (json/jsonl/csv/parquet/arrow) loaded through `datasets`. Each split of a DatasetDict is one unit
(`<path>::<split>`); its split name (train/validation/test) becomes the documents' split unless the source
forces one."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hibert.config.data import SourceConfig
from hibert.data_prep import records as R
from hibert.data_prep.readers.fields import records_from_fields
from hibert.data_prep.readers.files import expand, sha256_file

_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
_SPLIT_NAMES = {"train": "train", "validation": "valid", "valid": "valid", "dev": "valid", "test": "test"}


def _saved_kind(path: Path) -> str | None:
    if (path / "dataset_dict.json").is_file():
        return "dict"
    if (path / "state.json").is_file():
        return "dataset"
    return None


def _load(unit: str) -> Any:
    """The `datasets.Dataset` behind a unit."""
    import datasets  # lazy: ~0.6 s; only hf sources pay for it

    path, _, split = unit.partition("::")
    p = Path(path)
    kind = _saved_kind(p) if p.is_dir() else None
    if kind == "dict":
        return datasets.load_from_disk(str(p))[split]
    if kind == "dataset":
        return datasets.load_from_disk(str(p))
    files = [str(f) for f in expand(path) if "".join(f.suffixes[-1:]) in _BUILDERS]
    if not files:
        raise FileNotFoundError(f"hf source {path!r}: not a saved dataset and no data files")
    builder = _BUILDERS[Path(files[0]).suffix]
    return datasets.load_dataset(builder, data_files=files, split="train")


def list_units(source: SourceConfig) -> list[tuple[str, int]]:
    p = Path(source.path)
    if p.is_dir() and _saved_kind(p) == "dict":
        import datasets  # lazy: ~0.6 s; only a saved DatasetDict pays for it

        names = list(datasets.load_from_disk(str(p)).keys())
        if source.hf_split:
            if source.hf_split not in names:
                raise ValueError(f"hf source {source.path!r} has splits {names}, not {source.hf_split!r}")
            names = [source.hf_split]
        units = [f"{source.path}::{n}" for n in names]
    elif (p.is_dir() and _saved_kind(p)) or expand(source.path):
        units = [source.path]
    else:
        return []
    return [(u, sum(Path(f["filename"]).stat().st_size for f in _load(u).cache_files)) for u in units]


def checksum(source: SourceConfig, unit: str) -> str:
    h = hashlib.sha256()
    for f in _load(unit).cache_files:
        h.update(bytes.fromhex(sha256_file(Path(f["filename"]))))
    return h.hexdigest()


def read(source: SourceConfig, name: str, unit: str, max_chars: int,
         part: int, parts: int) -> Iterator[R.RawDoc | R.Skip]:
    ds = _load(unit)
    split_name = unit.partition("::")[2]
    prefix = f"{split_name}:" if split_name else ""
    forced = _SPLIT_NAMES.get(split_name)
    end = len(ds) if source.max_records is None else min(len(ds), source.max_records)
    rows = range(part, end, parts)
    for row, obj in zip(rows, ds.select(rows)):
        for rec in records_from_fields(obj, source, name, f"{prefix}{row}", unit, row, max_chars):
            if isinstance(rec, R.RawDoc):
                rec.split = forced
            yield rec
