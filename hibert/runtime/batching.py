"""Token-budget micro-batches, planned per epoch, sliced per rank, resumable from a counter.

An epoch's plan is a pure function of (seed, epoch, document lengths): shuffle, sort by length inside
buckets (so packed batches hold similar-length documents), pack greedily under the token budget, shuffle
the batches. Global step g uses micro-batches [g*W*A, (g+1)*W*A); rank r's accumulation slot a takes
micro-batch g*W*A + a*W + r, so a world of W ranks sees exactly the global batches of one process with
W*A accumulation slots. The plan is padded by wrapping around so every rank gets the same number of steps.
Resume state is just (epoch, steps done in the epoch) — O(1), no replay of the data.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchPlan:
    batches: list[np.ndarray]          # micro-batches of document indices, in consumption order
    micro_per_step: int                # W * A
    oversized: int                     # documents alone over the token budget (each gets its own batch)

    @property
    def steps(self) -> int:
        return -(-len(self.batches) // self.micro_per_step) if self.batches else 0

    def micro_batch(self, step: int, accum_slot: int, rank: int, world: int) -> np.ndarray:
        k = step * self.micro_per_step + accum_slot * world + rank
        return self.batches[k % len(self.batches)]

    def rank_batches(self, rank: int, world: int, accum: int, start_step: int = 0) -> list[np.ndarray]:
        """This rank's micro-batches from `start_step` to the end of the epoch, in order."""
        return [self.micro_batch(s, a, rank, world)
                for s in range(start_step, self.steps) for a in range(accum)]


def doc_costs(num_tokens: np.ndarray, num_sentences: np.ndarray) -> np.ndarray:
    """Tokens a document costs in a packed batch: its tokens plus one EOS per sentence."""
    return np.asarray(num_tokens, dtype=np.int64) + np.asarray(num_sentences, dtype=np.int64)


def plan_epoch(costs: np.ndarray, *, seed: int, epoch: int, batch_tokens: int, max_docs: int,
               world: int, accum: int, bucket_batches: int = 64) -> BatchPlan:
    n = len(costs)
    if n == 0:
        return BatchPlan([], world * accum, 0)
    rng = np.random.default_rng([seed, epoch, 0xBA7C])
    order = rng.permutation(n)
    mean_docs = max(1, min(max_docs, batch_tokens // max(1, int(costs.mean()))))
    bucket = max(1, bucket_batches * mean_docs)
    batches: list[np.ndarray] = []
    oversized = 0
    for start in range(0, n, bucket):
        chunk = order[start:start + bucket]
        chunk = chunk[np.argsort(costs[chunk], kind="stable")]
        cur: list[int] = []
        used = 0
        for doc in chunk.tolist():
            c = int(costs[doc])
            if cur and (used + c > batch_tokens or len(cur) >= max_docs):
                batches.append(np.asarray(cur, dtype=np.int64))
                cur, used = [], 0
            if c > batch_tokens:
                oversized += 1
            cur.append(doc)
            used += c
        if cur:
            batches.append(np.asarray(cur, dtype=np.int64))
    perm = rng.permutation(len(batches))
    return BatchPlan([batches[i] for i in perm], world * accum, oversized)
