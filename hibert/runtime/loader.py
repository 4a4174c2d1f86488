"""DataLoader over planned micro-batches. Item k of an epoch is a pure function of (plan, k), so the
loader can start anywhere (resume) and any worker count gives the same batches."""
from __future__ import annotations

import os
import time
from functools import partial

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from hibert.runtime.preemption import ignore_preemption_signals
from hibert.runtime.task import LoaderItem, Task


class MicroBatches(Dataset):
    def __init__(self, task: Task, dataset, batches: list[np.ndarray], epoch: int):
        self.task, self.dataset, self.batches, self.epoch = task, dataset, batches, epoch

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, k: int) -> LoaderItem:
        t0 = time.perf_counter()
        item = self.task.make_item(self.dataset, self.batches[k], self.epoch)
        item.collate_s = time.perf_counter() - t0
        return item


def make_loader(task: Task, dataset, batches: list[np.ndarray], epoch: int, workers: int,
                pin_memory: bool = False) -> DataLoader:
    """`pin_memory` (CUDA): a loader thread copies each batch to page-locked memory, so the host -> device
    copy in `LoaderItem.to` is asynchronous (non_blocking) and overlaps the previous step's kernels."""
    return DataLoader(MicroBatches(task, dataset, batches, epoch), batch_size=None, shuffle=False,
                      num_workers=workers, pin_memory=pin_memory and torch.cuda.is_available(),
                      worker_init_fn=partial(ignore_preemption_signals, parent=os.getpid()) if workers else None,
                      prefetch_factor=4 if workers else None, persistent_workers=False,
                      multiprocessing_context="fork" if workers else None,
                      generator=torch.Generator().manual_seed(0))
