"""spaCy imported without torch.

Importing spaCy imports thinc, whose `compat` module imports torch (2-3 s and a few hundred MB per process)
only to offer torch-backed layers. Segmentation uses spaCy's rule-based tokenizer and sentencizer, which
never touch them, so torch is hidden for the duration of this one import when nothing has imported it yet:
thinc then records `has_torch = False` and torch stays importable afterwards for any other code. When torch
is already loaded there is nothing to save and spaCy is imported as usual.

The fork server of `hibert prep --workers N` preloads this module, so every worker starts with spaCy loaded.
"""
from __future__ import annotations

import sys

if "torch" in sys.modules or "spacy" in sys.modules:
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
