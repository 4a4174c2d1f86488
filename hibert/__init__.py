"""HIBERT: hierarchical document encoders, their pretraining and finetuning heads (README.md)."""
from pathlib import Path as _Path

# Imported from a source checkout (the repository root on sys.path: `python -m hibert.cli` run from the root, a
# benchmark script, pytest): the root's folders are this package's subpackages, as pyproject's package-dir installs
# them (hibert.modeling = modeling/, hibert.data_prep = data_prep/, ...). Searching the root after this folder makes
# them importable without an install — a bare GPU node runs the checkout as it is — and keeps a checkout on
# sys.path from shadowing an installed copy's subpackages with nothing.
_ROOT = _Path(__file__).resolve().parent.parent
if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "modeling" / "__init__.py").is_file():
    __path__.append(str(_ROOT))
