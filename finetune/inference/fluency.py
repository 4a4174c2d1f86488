"""Whether a decoding model's training says it can write yet: one line for `hibert summarize`, `hibert evaluate`
and the demo, instead of presenting repeated pieces ("the the the aaaass...") as a summary without comment.

The signal is the validation perplexity (per target subword, teacher forcing) the export recorded for its own
weights when it was trained (the selected checkpoint's evaluation, not the last step's). Above `WRITES_PPL` beam
search on news text was seen to fall back on the most frequent pieces: the CPU-sized recipes' abstractive models
sit far above it (the demo's: see docs/experiments.md). The threshold is this project's choice — none of the
papers implemented here reports a validation perplexity. The line is a warning: the command still does what
was asked."""
from __future__ import annotations

import json
import math
from pathlib import Path

WRITES_PPL = 50.0   # validation perplexity above which a decoder's summaries are not expected to read as text


def recorded_ppl(meta: dict) -> float | None:
    """The validation perplexity of the exported weights: their own evaluation's (`metrics`); for an average
    of several checkpoints (never evaluated as such), the best of the averaged ones' (`selected_metrics`)."""
    try:
        own = meta.get("metrics", {}).get("valid_ppl")
        if own is not None:
            return float(own)
        each = [float(m["valid_ppl"]) for m in (meta.get("selected_metrics") or {}).values()
                if isinstance(m, dict) and m.get("valid_ppl") is not None]
    except (ValueError, TypeError, AttributeError):
        return None
    return min(each) if each else None


def fluency_note(export_dir: Path) -> str | None:
    """The one-line note for a decoding export whose recorded validation perplexity is above WRITES_PPL, else
    None (also when the export recorded none: nothing is claimed either way)."""
    try:
        meta = json.loads((Path(export_dir) / "export.json").read_text())
    except (OSError, ValueError):
        return None
    ppl = recorded_ppl(meta) if isinstance(meta, dict) else None
    if ppl is None:
        return None
    if not math.isfinite(ppl) or ppl <= WRITES_PPL:
        return None
    return (f"this model's decoder cannot write yet (validation perplexity {ppl:.0f}, above {WRITES_PPL:.0f}): "
            "expect repeated pieces, not sentences. A CPU-sized recipe trains the pipeline, not a writer: a "
            "decoder that writes needs a full corpus and GPU hours (configs/recipes/liu-lapata-2019.yaml, "
            "docs/abstractive.md)")
