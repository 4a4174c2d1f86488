"""Masked-sentence document transformation (HIBERT §3.2, "Document Masking").

Select 15% of a document's sentences (at least one); each selected sentence is, with probability
0.8, replaced by [MASK] tokens of the same length, 0.1 kept as it is, 0.1 replaced by a random sentence
from another document. The decoder then predicts the ORIGINAL selected sentences.

The transformation is a pure function of (seed, epoch, document index) — its RNG is seeded from exactly
those three numbers — so resumed runs and any number of ranks or loader workers see identical masks.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hibert.config.training import ObjectiveConfig
from hibert.tokens import MASK_ID

MASK, KEEP, RANDOM = 0, 1, 2


@dataclass
class MaskedDocument:
    sentences: list[np.ndarray]       # the encoder's input (after the 80/10/10 transformation)
    positions: list[int]              # indices of the selected sentences, ascending
    targets: list[np.ndarray]         # original tokens of the selected sentences (what the decoder predicts)
    actions: list[int]                # MASK / KEEP / RANDOM per selected sentence


def document_rng(seed: int, epoch: int, doc_index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, doc_index])


def num_selected(num_sentences: int, spec: ObjectiveConfig) -> int:
    k = max(spec.min_selected, int(spec.select_ratio * num_sentences + 0.5))
    if spec.max_selected is not None:
        k = min(k, spec.max_selected)
    return max(0, min(k, num_sentences))


def draw_actions(rng: np.random.Generator, num_sentences: int, spec: ObjectiveConfig) -> tuple[list[int], list[int]]:
    """The selected sentences (ascending) and what happens to each: MASK / KEEP / RANDOM."""
    k = num_selected(num_sentences, spec)
    positions = np.sort(rng.choice(num_sentences, size=k, replace=False)).tolist() if k else []
    mask, keep = spec.mask_prob, spec.mask_prob + spec.keep_prob
    actions = [MASK if u < mask else KEEP if u < keep else RANDOM for u in rng.random(k).tolist()]
    return positions, actions


def mask_document(sentences: list[np.ndarray], spec: ObjectiveConfig, seed: int, epoch: int, doc_index: int,
                  random_sentence: Callable[[np.random.Generator], np.ndarray]) -> MaskedDocument:
    """Apply the transformation to one document (chunk). `random_sentence(rng)` draws a sentence from
    another document; it is only called for RANDOM actions and must itself be deterministic in rng."""
    rng = document_rng(seed, epoch, doc_index)
    positions, actions = draw_actions(rng, len(sentences), spec)
    out = list(sentences)
    for pos, action in zip(positions, actions):
        if action == MASK:
            out[pos] = np.full(len(sentences[pos]), MASK_ID, dtype=sentences[pos].dtype)
        elif action == RANDOM:
            out[pos] = np.asarray(random_sentence(rng), dtype=sentences[pos].dtype)
    return MaskedDocument(out, positions, [sentences[p] for p in positions], actions)


def other_document(rng: np.random.Generator, num_docs: int, doc_index: int) -> int:
    """A document j != doc_index, uniformly."""
    if num_docs < 2:
        raise ValueError("random-sentence replacement needs at least two documents")
    j = int(rng.integers(num_docs - 1))
    return j + (j >= doc_index)


def other_document_sentence(dataset, doc_index: int) -> Callable[[np.random.Generator], np.ndarray]:
    """A `random_sentence` drawing uniformly a document j != doc_index, then one of its sentences."""
    n = len(dataset)

    def draw(rng: np.random.Generator) -> np.ndarray:
        sents = dataset[other_document(rng, n, doc_index)]
        return sents[int(rng.integers(len(sents)))]

    return draw


def flat_reader(dataset) -> Callable[[int], tuple[np.ndarray, np.ndarray]]:
    """i -> document i as (its words back to back, words per sentence): `dataset.flat` where the dataset
    has it (prepared shards: one copy out of the memory map), else built from `dataset[i]`."""
    flat = getattr(dataset, "flat", None)
    if flat is not None:
        return flat

    def read(i: int) -> tuple[np.ndarray, np.ndarray]:
        sents = dataset[i]
        lens = np.fromiter((len(x) for x in sents), dtype=np.int64, count=len(sents))
        return (np.concatenate(sents) if len(sents) else np.empty(0, np.int32)), lens

    return read


@dataclass
class MaskedBatch:
    """Documents after the transformation, flat (the form `make_pretrain_batch_flat` takes)."""
    words: np.ndarray                 # masked documents' words back to back
    word_lens: np.ndarray             # [S] words per sentence
    doc_lens: np.ndarray              # [B] sentences per document
    target_rows: np.ndarray           # [M] sentence row (over the batch) of each selected sentence
    target_words: np.ndarray          # their ORIGINAL words back to back
    target_word_lens: np.ndarray      # [M]


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Indices start..start+len of every range, back to back."""
    ends = np.cumsum(lens)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) + np.repeat(starts - (ends - lens), lens)


def mask_batch(dataset, doc_indices, spec: ObjectiveConfig, seed: int, epoch: int) -> MaskedBatch:
    """`mask_document` for every document of a batch, with the same random draws (so the same masks), on
    flat arrays: only the draws run per document; the copies, MASK fills and random-sentence splices are
    one gather over the batch (the DataLoader hot path)."""
    n = len(dataset)
    read = flat_reader(dataset)
    words, lens, doc_lens, rows, acts = [], [], [], [], []
    random_rows, random_sents = [], []
    first = 0
    for i in np.asarray(doc_indices).tolist():
        toks, sl = read(i)
        rng = document_rng(seed, epoch, i)
        positions, actions = draw_actions(rng, len(sl), spec)
        if RANDOM in actions:
            for pos, action in zip(positions, actions):
                if action == RANDOM:
                    ot, ol = read(other_document(rng, n, i))
                    s = int(rng.integers(len(ol)))
                    a = int(ol[:s].sum())
                    random_rows.append(first + pos)
                    random_sents.append(ot[a:a + int(ol[s])])
        words.append(toks)
        lens.append(sl)
        doc_lens.append(len(sl))
        rows.extend(first + p for p in positions)
        acts.extend(actions)
        first += len(sl)
    orig = np.concatenate(words) if words else np.empty(0, np.int32)
    word_lens = np.concatenate(lens).astype(np.int64, copy=False) if lens else np.empty(0, np.int64)
    starts = np.cumsum(word_lens) - word_lens
    target_rows = np.asarray(rows, dtype=np.int64)
    target_word_lens = word_lens[target_rows]
    target_words = orig[_ranges(starts[target_rows], target_word_lens)]
    # the masked stream: every sentence is a range of `pool` = originals, a run of MASK_IDs, random sentences
    mask_run = np.full(int(word_lens.max(initial=0)), MASK_ID, dtype=orig.dtype)
    pool = np.concatenate([orig, mask_run, *random_sents]).astype(np.int64, copy=False)
    src, out_lens = starts.copy(), word_lens.copy()
    acts_arr = np.asarray(acts, dtype=np.int64)
    src[target_rows[acts_arr == MASK]] = len(orig)
    if random_rows:
        r = np.asarray(random_rows, dtype=np.int64)
        rl = np.fromiter((len(x) for x in random_sents), dtype=np.int64, count=len(random_sents))
        src[r] = len(orig) + len(mask_run) + np.cumsum(rl) - rl
        out_lens[r] = rl
    return MaskedBatch(pool[_ranges(src, out_lens)], out_lens, np.asarray(doc_lens, dtype=np.int64),
                       target_rows, target_words.astype(np.int64, copy=False), target_word_lens)
