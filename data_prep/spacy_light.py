"""spaCy imported without torch.

Importing spaCy imports thinc, whose `compat` module imports torch (2-3 s and a few hundred MB per process)
only to offer torch-backed layers. Segmentation uses spaCy's rule-based tokenizer and sentencizer, which
never touch them, so torch is hidden for the duration of this one import when nothing has imported it yet
and no other thread runs (the hiding is process-wide: another thread's `import torch` would fail meanwhile).
Torch stays importable afterwards, but thinc keeps `has_torch = False` for the life of the process: thinc's
torch-backed layers (spaCy transformer pipelines) do not work in it. When torch is already loaded, or other
threads run, spaCy is imported as usual.

With a fork server (`hibert prep --workers N` when torch is loaded or threads run), the server preloads this
module, so every worker starts with spaCy loaded; forked workers import it themselves, side by side.
"""
from __future__ import annotations

import sys
import threading

if "torch" in sys.modules or "spacy" in sys.modules or threading.active_count() > 1:
    import spacy
    from spacy.lang.en import English
else:
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` now raises ImportError
    try:
        import spacy
        from spacy.lang.en import English
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]

__all__ = ["English", "spacy"]
