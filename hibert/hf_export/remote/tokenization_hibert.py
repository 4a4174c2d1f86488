"""HIBERT's SentencePiece tokenizer for Hugging Face `transformers` (remote code, `trust_remote_code=True`).

Written by `hibert export-hf`; self-contained (sentencepiece and transformers only). A document goes in as text or
as a list of sentences; out come the `[docs, sentences, tokens]` ids `HibertModel` reads, made as the training
project makes them at inference:

* every sentence is SentencePiece-encoded with the model's own tokenizer.model (no BOS), cut to
  `max_sentence_tokens` subwords, and EOS (id 3) appended (its state is the sentence vector); empty sentences, and
  sentences with no subword, are dropped;
* a document of more than `max_doc_sentences` sentences is cut into chunks of that many (`long_documents="chunk"`,
  the project's extractive scoring: `document_index` maps each chunk to its input document) or keeps its first
  chunk (`"truncate"`, what the project's abstractive encoder reads);
* the limits are the ones the model's training data was prepared with (export.json `data.limits`).

Sentence splitting, where text goes in: blank lines separate paragraphs, as in the project. PTB-tokenized input
(lowercased, `-lrb-`, `` `` ``, ` n't`: See et al.'s CNN/DM) is split and detokenized with the project's own rules
(copied here), which gives the project's sentences exactly. Any other text is split by a simple rule (after
. ! ? followed by a capital, a digit or an opening quote; common abbreviations and initials kept) where the project
runs a spaCy/stanza segmenter: the sentences can differ. Pass pre-split sentences (a list of strings per document)
to get exactly the project's input from the project's segmentation.
"""
from __future__ import annotations

import os
import re
import shutil
from typing import Any

import sentencepiece as spm
from transformers import BatchEncoding, PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "tokenizer.model"}
PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID, SEP_ID = 0, 1, 2, 3, 4, 5   # fixed in every HIBERT tokenizer.model

# ---------------------------------------------------------------- PTB-tokenized text (the project's rules)
_PTB_MARKERS = re.compile(r"(-lrb-|-rrb-| n't\b| 's\b| `` | '' )")
_FINAL = {".", "!", "?"}
_CLOSERS = {"''", "'", "-rrb-", "-rsb-", ")", "]", '"'}
_BRACKETS = {"-lrb-": "(", "-rrb-": ")", "-lsb-": "[", "-rsb-": "]", "-lcb-": "{", "-rcb-": "}"}
_CLITICS = re.compile(r" (n't|'s|'re|'ve|'ll|'d|'m|')(?=\s|$)", re.I)
_NO_SPACE_BEFORE = re.compile(r" ([.,;:!?%)\]}]|\.\.\.)")
_NO_SPACE_AFTER = re.compile(r"([(\[{$#]) ")


def looks_ptb(text: str) -> bool:
    """See et al.'s CNN/DM style: lowercased, PTB tokens (-lrb-, n't split off, `` '')."""
    return bool(_PTB_MARKERS.search(text)) and text == text.lower()


def ptb_split(text: str) -> list[list[str]]:
    """Token lists, cut after a final punctuation token (and any closing quote/bracket after it)."""
    sentences, current = [], []
    tokens = text.split()
    for i, tok in enumerate(tokens):
        current.append(tok)
        if tok in _FINAL or (tok in _CLOSERS and len(current) > 1 and current[-2] in _FINAL):
            if i + 1 < len(tokens) and tokens[i + 1] in _CLOSERS:
                continue
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


def ptb_detokenize(tokens: list[str]) -> str:
    """Readable text: brackets and quotes restored, clitics and punctuation attached."""
    marks = {"``": '"\u0001', "''": '\u0002"'}
    text = " ".join(marks.get(t, _BRACKETS.get(t, t)) for t in tokens)
    text = text.replace("\u0001 ", "").replace("\u0001", "").replace(" \u0002", "").replace("\u0002", "")
    text = _CLITICS.sub(r"\1", text)
    text = _NO_SPACE_BEFORE.sub(r"\1", text)
    return _NO_SPACE_AFTER.sub(r"\1", text)


# ---------------------------------------------------------------- any other text: a simple rule
_BOUNDARY = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s+[\"'\u201c\u2018(\[]?[A-Z0-9])")
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "etc", "inc", "ltd", "co", "corp", "no",
    "nos", "fig", "gen", "gov", "sen", "rep", "lt", "col", "capt", "sgt", "rev", "jan", "feb", "mar", "apr", "jun",
    "jul", "aug", "sep", "sept", "oct", "nov", "dec", "e.g", "i.e", "u.s", "u.k", "u.n", "a.m", "p.m", "approx",
}


def simple_split(paragraph: str) -> list[str]:
    """Sentences of one paragraph: a cut after . ! ? (and closing quotes/brackets) before a capital, a digit or an
    opening quote, except after a common abbreviation or an initial."""
    out, start = [], 0
    for m in _BOUNDARY.finditer(paragraph):
        if paragraph[m.start()] == ".":
            before = paragraph[start:m.start()].split()
            word = before[-1].lstrip("\"'(\u201c\u2018[").lower() if before else ""
            if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
                continue
        out.append(paragraph[start:m.end()])
        start = m.end()
    out.append(paragraph[start:])
    return [" ".join(s.split()) for s in out if s.strip()]


def split_sentences(text: str) -> list[str]:
    """A document's sentences: paragraphs at blank lines; PTB-tokenized text by the project's PTB rules (detokenized),
    any other text by `simple_split`."""
    ptb = looks_ptb(text)
    out = []
    for paragraph in (p for p in re.split(r"\n\s*\n", text) if p.strip()):
        out += [ptb_detokenize(t) for t in ptb_split(paragraph)] if ptb else simple_split(paragraph)
    return [s for s in out if s.strip()]


class HibertTokenizer(PreTrainedTokenizer):
    """HIBERT's SentencePiece tokenizer. `tokenizer(documents)` gives the encoder's padded input:

        batch = tokenizer(["First document. Its second sentence.", ["A pre-split", "document."]],
                          return_tensors="pt")
        batch["input_ids"]        # [rows, sentences, tokens]: words + EOS, PAD after
        batch["attention_mask"]   # [rows, sentences, tokens]
        batch["sentence_mask"]    # [rows, sentences]
        batch["document_index"]   # [rows]: the input document of each row (long documents give several)

    A document is a string (split into sentences, see the module docstring) or a list of sentence strings; a single
    string, or a single list with `is_split_into_sentences=True`, is one document. The generic methods
    (`tokenize`, `convert_tokens_to_ids`, `decode`, `encode`: one sentence + EOS) work on single sentences."""

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask", "sentence_mask"]

    def __init__(self, vocab_file: str, max_sentence_tokens: int = 50, max_doc_sentences: int = 30,
                 long_documents: str = "chunk", unk_token: str = "<unk>", bos_token: str = "<s>",
                 eos_token: str = "</s>", pad_token: str = "<pad>", mask_token: str = "[MASK]",
                 sep_token: str = "[SEP]", sp_model_kwargs: dict[str, Any] | None = None, **kwargs):
        self.vocab_file = vocab_file
        self.sp_model_kwargs = sp_model_kwargs or {}
        self.sp_model = spm.SentencePieceProcessor(**self.sp_model_kwargs)
        self.sp_model.Load(vocab_file)
        got = (self.sp_model.pad_id(), self.sp_model.unk_id(), self.sp_model.bos_id(), self.sp_model.eos_id(),
               self.sp_model.piece_to_id(str(mask_token)), self.sp_model.piece_to_id(str(sep_token)))
        if got != (PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID, SEP_ID):
            raise ValueError(f"{vocab_file}: special ids (pad, unk, bos, eos, [MASK], [SEP]) are {got}, expected "
                             f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID, SEP_ID)}: not a HIBERT tokenizer.model")
        if long_documents not in ("chunk", "truncate"):
            raise ValueError(f"long_documents must be 'chunk' or 'truncate', not {long_documents!r}")
        self.max_sentence_tokens = int(max_sentence_tokens)
        self.max_doc_sentences = int(max_doc_sentences)
        self.long_documents = long_documents
        super().__init__(unk_token=unk_token, bos_token=bos_token, eos_token=eos_token, pad_token=pad_token,
                         mask_token=mask_token, sep_token=sep_token, sp_model_kwargs=self.sp_model_kwargs,
                         max_sentence_tokens=self.max_sentence_tokens, max_doc_sentences=self.max_doc_sentences,
                         long_documents=long_documents, **kwargs)

    # ------------------------------------------------------------ the vocabulary (PreTrainedTokenizer's interface)
    @property
    def vocab_size(self) -> int:
        return self.sp_model.get_piece_size()

    def get_vocab(self) -> dict[str, int]:
        vocab = {self.sp_model.id_to_piece(i): i for i in range(self.vocab_size)}
        vocab.update(getattr(self, "added_tokens_encoder", {}) or {})
        return vocab

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return self.sp_model.encode(text, out_type=str)

    def _convert_token_to_id(self, token: str) -> int:
        return self.sp_model.piece_to_id(token)

    def _convert_id_to_token(self, index: int) -> str:
        return self.sp_model.id_to_piece(index)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.sp_model.decode_pieces(tokens)

    def build_inputs_with_special_tokens(self, token_ids_0: list[int],
                                         token_ids_1: list[int] | None = None) -> list[int]:
        """A sentence row: its words, then EOS (pairs are not a HIBERT input: both sentences, each with its EOS)."""
        out = list(token_ids_0) + [EOS_ID]
        return out if token_ids_1 is None else out + list(token_ids_1) + [EOS_ID]

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
        if already_has_special_tokens:
            return [int(i in (PAD_ID, BOS_ID, EOS_ID)) for i in token_ids_0]
        out = [0] * len(token_ids_0) + [1]
        return out if token_ids_1 is None else out + [0] * len(token_ids_1) + [1]

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"]
        out = os.path.join(save_directory, name)
        if os.path.abspath(self.vocab_file) != os.path.abspath(out):
            if os.path.isfile(self.vocab_file):
                shutil.copyfile(self.vocab_file, out)
            else:
                with open(out, "wb") as f:
                    f.write(self.sp_model.serialized_model_proto())
        return (out,)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["sp_model"] = None
        state["_sp_proto"] = self.sp_model.serialized_model_proto()
        return state

    def __setstate__(self, state):
        proto = state.pop("_sp_proto")
        self.__dict__ = state
        self.sp_model = spm.SentencePieceProcessor(**self.sp_model_kwargs)
        self.sp_model.LoadFromSerializedProto(proto)

    # ------------------------------------------------------------ documents
    def split_sentences(self, text: str) -> list[str]:
        """The sentences of a document's text (module docstring: PTB rules, else a simple rule)."""
        return split_sentences(text)

    def encode_sentences(self, sentences: list[str], max_sentence_tokens: int | None = None
                         ) -> tuple[list[str], list[list[int]]]:
        """(kept sentence texts, their subword ids without EOS): empty sentences and sentences without a subword
        dropped, each cut to `max_sentence_tokens` (default: the model's)."""
        limit = self.max_sentence_tokens if max_sentence_tokens is None else int(max_sentence_tokens)
        texts = [s for s in sentences if s.strip()]
        ids = [x[:limit] for x in self.sp_model.encode(texts, out_type=int)] if texts else []
        keep = [i for i, x in enumerate(ids) if len(x)]
        return [texts[i] for i in keep], [ids[i] for i in keep]

    def __call__(self, documents, *, is_split_into_sentences: bool = False, long_documents: str | None = None,
                 max_sentence_tokens: int | None = None, max_doc_sentences: int | None = None,
                 pad_to_multiple_of: int | None = None, return_tensors: str | None = None,
                 return_sentences: bool = False, **kwargs) -> BatchEncoding:
        """Documents -> the encoder's padded input (see the class docstring). `return_sentences`: also the kept
        sentence texts of each row (`sentences`, a list of lists of strings, never a tensor)."""
        unknown = sorted(set(kwargs) - {"padding", "truncation", "add_special_tokens"})
        if unknown:
            raise TypeError(f"HibertTokenizer got unexpected arguments {unknown} (it always pads, and cuts to the "
                            "model's max_sentence_tokens / max_doc_sentences)")
        mode = long_documents or self.long_documents
        if mode not in ("chunk", "truncate"):
            raise ValueError(f"long_documents must be 'chunk' or 'truncate', not {mode!r}")
        step = self.max_doc_sentences if max_doc_sentences is None else int(max_doc_sentences)
        if isinstance(documents, str) or (is_split_into_sentences and documents and
                                          all(isinstance(s, str) for s in documents)):
            documents = [documents]
        rows: list[list[list[int]]] = []
        texts: list[list[str]] = []
        index: list[int] = []
        for d, doc in enumerate(documents):
            sentences = self.split_sentences(doc) if isinstance(doc, str) else list(doc)
            if not all(isinstance(s, str) for s in sentences):
                raise TypeError(f"document {d}: a document is a string or a list of sentence strings")
            kept, ids = self.encode_sentences(sentences, max_sentence_tokens)
            starts = list(range(0, len(ids), step)) or [0]
            for a in starts[:1] if mode == "truncate" else starts:
                rows.append([x + [EOS_ID] for x in ids[a:a + step]])
                texts.append(kept[a:a + step])
                index.append(d)
        width = max([len(r) for r in rows] + [1])
        length = max([len(s) for r in rows for s in r] + [1])
        if pad_to_multiple_of:
            width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
            length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
        input_ids = [[s + [PAD_ID] * (length - len(s)) for s in r] + [[PAD_ID] * length] * (width - len(r))
                     for r in rows]
        attention = [[[1] * len(s) + [0] * (length - len(s)) for s in r] + [[0] * length] * (width - len(r))
                     for r in rows]
        sentence_mask = [[1] * len(r) + [0] * (width - len(r)) for r in rows]
        out = BatchEncoding({"input_ids": input_ids, "attention_mask": attention, "sentence_mask": sentence_mask,
                             "document_index": index}, tensor_type=return_tensors)
        if return_sentences:
            out["sentences"] = texts
        return out
