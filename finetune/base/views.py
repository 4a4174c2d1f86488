"""A view of a prepared `DocumentDataset` split over some of its rows, with the dataset's interface: what
the runtime (`doc_num_tokens`, `doc_num_sentences`, `doc_source`, `__len__`, `__getitem__`) and the
evaluation (summary, doc_id, sentences_text, ... per item) use. Per-item accessors of the dataset are
forwarded with the view's index mapped through `rows`. Picklable (the dataset pickles by path), so
DataLoader workers rebuild nothing."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


class RowView:
    base: Any                          # the DocumentDataset
    rows: np.ndarray                   # view item k = base item rows[k]
    doc_num_tokens: np.ndarray         # per view item, as the runtime plans batches
    doc_num_sentences: np.ndarray
    doc_source: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int) -> list[np.ndarray]:
        return self.base[int(self.rows[k])]

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def split(self) -> str:
        return self.base.split

    @property
    def tokenizer_path(self) -> Path:
        return self.base.tokenizer_path

    @property
    def manifest(self) -> dict[str, Any]:
        return self.base.manifest

    @property
    def dir(self) -> Path:
        return self.base.dir

    def __getattr__(self, name: str):
        # only called for names the view lacks: the dataset's per-item accessors take the view's index
        if name.startswith("_") or name in ("base", "rows"):
            raise AttributeError(name)
        attr = getattr(self.base, name)
        if callable(attr):
            return lambda k, *a, **kw: attr(int(self.rows[k]), *a, **kw)
        return attr
