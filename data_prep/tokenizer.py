"""SentencePiece: train on segmented sentences, or reuse a given model; source and target share it.

Every model has the platform's fixed special ids (hibert/tokens.py): <pad>=0 <unk>=1 <s>=2 </s>=3
[MASK]=4 [SEP]=5 — checked on load, so a foreign model cannot slip in with other ids.
"""
from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hibert import hashing
from hibert import tokens as T
from hibert.config.data import TokenizerConfig
from hibert.errors import UserError

MODEL_NAME = "tokenizer.model"


def file_sha256(path: Path) -> str:
    return hashing.file_sha256(Path(path))


def vocab_size(path: str | Path) -> int:
    """Pieces in a SentencePiece model (the encoder's vocabulary size)."""
    import sentencepiece as spm  # lazy: ~13 ms cold, which --help and config printing never need

    return spm.SentencePieceProcessor(model_file=str(path)).get_piece_size()


def load(path: str | Path) -> Any:
    """A SentencePieceProcessor, after checking the special ids."""
    import sentencepiece as spm  # lazy: ~13 ms cold, which --help and config printing never need

    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:  # missing, truncated, or not a SentencePiece model at all
        raise UserError(f"{path} is not a readable SentencePiece model ({str(e).splitlines()[0][:200]})") from None
    got = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id(),
           sp.piece_to_id(T.USER_DEFINED_SYMBOLS[0]), sp.piece_to_id(T.USER_DEFINED_SYMBOLS[1]))
    want = (T.PAD_ID, T.UNK_ID, T.BOS_ID, T.EOS_ID, T.MASK_ID, T.SEP_ID)
    if got != want:
        raise ValueError(f"{path}: special ids (pad, unk, bos, eos, [MASK], [SEP]) are {got}, expected {want}; "
                         "train it with data_prep (or pad_id=0 unk_id=1 bos_id=2 eos_id=3 "
                         "user_defined_symbols=[MASK],[SEP])")
    return sp


# SentencePiece's unigram trainer splits its work by thread and the result depends on the split: a fixed
# count keeps the model independent of the machine and of --workers (BPE does not care).
TRAIN_THREADS = 16


def train(sentences: Iterable[str], cfg: TokenizerConfig, out_dir: Path) -> Path:
    """Train into out_dir/tokenizer.{model,vocab}, deterministically (same sentences, same bytes) and
    atomically (a crash leaves no half model)."""
    import sentencepiece as spm  # lazy: ~13 ms cold, which --help and config printing never need

    out_dir.mkdir(parents=True, exist_ok=True)
    proto = io.BytesIO()  # in memory: no temporary path is recorded in the model
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=proto,
        model_type=cfg.model_type, vocab_size=cfg.vocab_size, hard_vocab_limit=cfg.hard_vocab_limit,
        character_coverage=cfg.character_coverage, input_sentence_size=cfg.sample_sentences,
        shuffle_input_sentence=True, normalization_rule_name="nmt_nfkc_cf" if cfg.lowercase else "nmt_nfkc",
        pad_id=T.PAD_ID, unk_id=T.UNK_ID, bos_id=T.BOS_ID, eos_id=T.EOS_ID,
        user_defined_symbols=T.USER_DEFINED_SYMBOLS, num_threads=TRAIN_THREADS, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    vocab = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))
    _atomic_write(out_dir / "tokenizer.vocab", vocab.encode("utf-8"))
    _atomic_write(out_dir / MODEL_NAME, proto.getvalue())  # last: its presence means "done"
    load(out_dir / MODEL_NAME)
    return out_dir / MODEL_NAME


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def install(model: str | Path, out_dir: Path) -> Path:
    """Copy an existing model (and its .vocab when present) into the dataset dir."""
    src = Path(model)
    load(src)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = src.with_suffix(".vocab")
    if vocab.is_file():
        shutil.copyfile(vocab, out_dir / "tokenizer.vocab")
    _atomic_write(out_dir / MODEL_NAME, src.read_bytes())
    return out_dir / MODEL_NAME


def describe(path: Path, cfg: TokenizerConfig, trained_on: int | None) -> dict[str, Any]:
    sp = load(path)
    return {"path": MODEL_NAME, "sha256": file_sha256(path), "vocab_size": sp.get_piece_size(),
            "model_type": cfg.model_type if trained_on is not None else None,
            "reused_from": cfg.model if trained_on is None else None, "trained_on_sentences": trained_on,
            "train_threads": TRAIN_THREADS if trained_on is not None else None,
            "special_ids": {"pad": T.PAD_ID, "unk": T.UNK_ID, "bos": T.BOS_ID, "eos": T.EOS_ID,
                            "mask": T.MASK_ID, "sep": T.SEP_ID}}
