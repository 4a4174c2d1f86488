"""HIBERT: hierarchical document encoders, their pretraining and finetuning heads (README.md)."""
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path as _Path

# The repository's top-level folders that install as this package's subpackages (pyproject's package-dir;
# tests/test_bare_node.py checks the two agree).
_SUBPACKAGES = ("modeling", "data_prep", "pretrain", "finetune", "slurm", "configs")
_ROOT = _Path(__file__).resolve().parent.parent


class _CheckoutSubpackages(importlib.abc.MetaPathFinder):
    """`hibert.modeling` and its siblings from a source checkout that is not installed (a bare GPU node runs the
    checkout as it is), or whose `hibert/` folder shadows an installed copy (`python -m hibert.cli` from the
    root, a benchmark script, pytest put the root first on sys.path). Consulted after every other finder, so an
    installed or editable copy's own mapping wins; those six names only."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        parent, _, sub = name.partition(".")
        if parent != __name__ or sub not in _SUBPACKAGES:
            return None
        init = _ROOT / sub / "__init__.py"
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)]) \
            if init.is_file() else None


if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "modeling" / "__init__.py").is_file() \
        and not any(isinstance(f, _CheckoutSubpackages) for f in sys.meta_path):
    sys.meta_path.append(_CheckoutSubpackages())
