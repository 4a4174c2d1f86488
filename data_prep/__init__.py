"""data_prep — raw corpora to the prepared dataset format that pretraining and finetuning read.

`DocumentDataset(dataset_dir, split)` is the read side; `prepare(cfg.data, ...)` (or `hibert prep`) builds it.
"""
from hibert.data_prep.dataset import DocumentDataset

__all__ = ["DocumentDataset", "prepare"]


def prepare(*args, **kwargs):
    """See data_prep.pipeline.prepare (imported lazily: the read side stays light)."""
    from hibert.data_prep.pipeline import prepare as _prepare  # lazy: +~0.16 s (config schema, tqdm, filelock)

    return _prepare(*args, **kwargs)
