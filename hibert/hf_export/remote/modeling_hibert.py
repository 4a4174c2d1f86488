"""HIBERT (Zhang et al. 2019, "HIBERT: Document Level Pre-training of Hierarchical Bidirectional Transformers for
Document Summarization", §3.1) for Hugging Face `transformers` (remote code, `trust_remote_code=True`).

Written by `hibert export-hf`; self-contained (torch and transformers only). A re-implementation of the training
project's encoder on the padded layout Hugging Face models take; same parameter names, same numbers (the export
test compares both in fp32):

* sentence encoder: a Transformer over each sentence's tokens (its words, then EOS), input = word embedding * sqrt(H)
  + sinusoidal position (eq. 1);
* sentence vector: the sentence encoder's state at the sentence's EOS (its last real token) + the embedding of the
  sentence's position in its document, from the same sinusoidal table (eq. 2);
* document encoder: a Transformer over a document's sentence vectors: context-sensitive sentence states.

Layers are post-LN (as in the paper) unless `config.norm_first` (pre-LN, with a final LayerNorm per stack).

Input layout (what `HibertTokenizer` returns): `input_ids [docs, sentences, tokens]`, each sentence row its word ids,
then EOS (id 3), then PAD (id 0); `attention_mask` the same shape, 1 on real tokens (EOS included); `sentence_mask
[docs, sentences]`, 1 on real sentences (default: the rows that hold a real token). Positions count real tokens /
sentences only, so right padding (the tokenizer's) and gaps give the same states as the project's packed layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_hibert import HibertConfig

IGNORE_LABEL = -100


def sinusoidal_table(num_positions: int, dim: int) -> Tensor:
    """Sine-cosine position embeddings (Vaswani et al. 2017 §3.5), computed in float64 then cast, as the project
    does; one table for word positions and sentence positions."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table.float()


class HibertLayer(nn.Module):
    """One encoder layer: self-attention + FFN with residuals and LayerNorm (post-LN unless norm_first).
    `qkv` is one [3H, H] projection (q, k, v in that order, heads contiguous), as in the project."""

    def __init__(self, config: HibertConfig):
        super().__init__()
        h, f = config.hidden, config.ffn
        self.heads = config.heads
        self.norm_first = config.norm_first
        self.qkv = nn.Linear(h, 3 * h)
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(h, f)
        self.ffn_out = nn.Linear(f, h)
        self.ffn_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.act = nn.ReLU() if config.activation == "relu" else nn.GELU()
        self.dropout = nn.Dropout(config.dropout)

    def _attn(self, x: Tensor, key_mask: Tensor) -> Tensor:
        g, length, hidden = x.shape
        q, k, v = self.qkv(x).view(g, length, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
        return self.dropout(self.attn_out(out.transpose(1, 2).reshape(g, length, hidden)))

    def _ffn(self, x: Tensor) -> Tensor:
        return self.dropout(self.ffn_out(self.act(self.ffn_in(x))))

    def forward(self, x: Tensor, key_mask: Tensor) -> Tensor:
        """`x [G, L, H]`, `key_mask [G, L]` bool (True = a key attention may look at; every row needs one)."""
        if self.norm_first:
            x = x + self._attn(self.attn_norm(x), key_mask)
            return x + self._ffn(self.ffn_norm(x))
        x = self.attn_norm(x + self._attn(x, key_mask))
        return self.ffn_norm(x + self._ffn(x))


class HibertStack(nn.Module):
    """`layers` HibertLayers (+ a final LayerNorm when pre-LN)."""

    def __init__(self, config: HibertConfig):
        super().__init__()
        self.layers = nn.ModuleList(HibertLayer(config) for _ in range(config.layers))
        self.final_norm = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps) if config.norm_first else nn.Identity()

    def forward(self, x: Tensor, key_mask: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, key_mask)
        return self.final_norm(x)


@dataclass
class HibertModelOutput(ModelOutput):
    """last_hidden_state: `[docs, sentences, H]` document-level, context-sensitive sentence states (zeros at padding);
    sentence_vectors: `[docs, sentences, H]` the document encoder's input: EOS state + sentence position embedding;
    token_states: `[docs, sentences, tokens, H]` sentence-level token states (zeros at padding);
    sentence_mask: `[docs, sentences]` bool, the real sentences; document_index: what the tokenizer gave (the input
    document of each row when long documents were cut into chunks), passed through."""

    last_hidden_state: Tensor | None = None
    sentence_vectors: Tensor | None = None
    token_states: Tensor | None = None
    sentence_mask: Tensor | None = None
    document_index: Tensor | None = None

    @property
    def sentence_states(self) -> Tensor | None:
        """The document-level sentence states (= last_hidden_state)."""
        return self.last_hidden_state


@dataclass
class HibertSentenceLabellingOutput(ModelOutput):
    """logits: `[docs, sentences, num_labels]` (softmax head) or `[docs, sentences]` (sigmoid head); scores:
    `[docs, sentences]` probability that a sentence belongs to the summary (0 at padding), as the project scores."""

    loss: Tensor | None = None
    logits: Tensor | None = None
    scores: Tensor | None = None
    last_hidden_state: Tensor | None = None
    sentence_mask: Tensor | None = None
    document_index: Tensor | None = None


def _return_dict(config: HibertConfig, given: bool | None) -> bool:
    return bool(getattr(config, "return_dict", True)) if given is None else given


class HibertPreTrainedModel(PreTrainedModel):
    config_class = HibertConfig
    base_model_prefix = "hibert"
    main_input_name = "input_ids"
    _no_split_modules = ["HibertLayer"]

    def _init_weights(self, module: nn.Module) -> None:
        """The project's init: Xavier-uniform linears with zero bias; N(0, H^-1/2) embeddings, PAD row zero;
        LayerNorm 1 / 0."""
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=module.embedding_dim ** -0.5)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class HibertModel(HibertPreTrainedModel):
    """The HIBERT encoder: parameter names as the project's `HibertEncoder` (token_embedding,
    sentence_encoder.layers.N.*, document_encoder.layers.N.*)."""

    _keys_to_ignore_on_load_unexpected = {r"^classifier\."}  # a finetuned export's head
    _auto_class = "AutoModel"   # save_pretrained copies this code (transformers 4.x does not register it on load)

    def __init__(self, config: HibertConfig):
        super().__init__(config)
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden, padding_idx=config.pad_token_id)
        self.embed_scale = math.sqrt(config.hidden)
        self.dropout = nn.Dropout(config.dropout)
        self.sentence_encoder = HibertStack(config)
        self.document_encoder = HibertStack(config)
        # the position table is no parameter and no buffer (so loading never has to restore it): made on first use
        self._tables: dict = {}
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.token_embedding

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.token_embedding = value

    def position_embedding(self, positions: Tensor) -> Tensor:
        key = positions.device
        if key not in self._tables:
            self._tables[key] = sinusoidal_table(self.config.max_positions, self.config.hidden).to(key)
        return self._tables[key][positions].to(self.token_embedding.weight.dtype)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, sentence_mask: Tensor | None = None,
                document_index: Tensor | None = None, output_token_states: bool = True,
                return_dict: bool | None = None, **kwargs) -> HibertModelOutput | tuple:
        """`input_ids [docs, sentences, tokens]` (a `[sentences, tokens]` tensor is one document); see the module's
        docstring for the layout. Returns a `HibertModelOutput` (a tuple of its fields when `return_dict=False`)."""
        if input_ids.dim() == 2:
            input_ids = input_ids[None]
            attention_mask = None if attention_mask is None else attention_mask[None]
            sentence_mask = None if sentence_mask is None else sentence_mask[None]
        if input_ids.dim() != 3:
            raise ValueError(f"input_ids must be [docs, sentences, tokens], got shape {tuple(input_ids.shape)}")
        num_docs, width, length = input_ids.shape
        tokens = input_ids.ne(self.config.pad_token_id) if attention_mask is None else attention_mask.bool()
        has_token = tokens.any(-1)
        if sentence_mask is None:
            sentence_mask = has_token
        else:
            sentence_mask = sentence_mask.bool()
            if (sentence_mask & ~has_token).any():
                raise ValueError("a sentence marked real in sentence_mask has no real token in attention_mask "
                                 "(every sentence holds at least its EOS)")
        tokens = tokens & sentence_mask[..., None]
        token_pos = (tokens.long().cumsum(-1) - 1).clamp_min(0)        # position among the row's real tokens
        sent_pos = (sentence_mask.long().cumsum(-1) - 1).clamp_min(0)  # position among the document's sentences
        need = max(int(token_pos.max()) + 1 if tokens.any() else 0,
                   int(sent_pos.max()) + 1 if sentence_mask.any() else 0)
        if need > self.config.max_positions:
            raise ValueError(f"positions up to {need} exceed max_positions {self.config.max_positions}: at most "
                             f"{self.config.max_positions - 1} words per sentence (+ EOS) and "
                             f"{self.config.max_positions} sentences per document")

        # sentence level: the real sentences only, [S, T] (padding rows are never computed)
        rows = sentence_mask.reshape(-1).nonzero().squeeze(1)
        ids = input_ids.reshape(-1, length).index_select(0, rows)
        mask = tokens.reshape(-1, length).index_select(0, rows)
        pos = token_pos.reshape(-1, length).index_select(0, rows)
        x = self.dropout(self.token_embedding(ids) * self.embed_scale + self.position_embedding(pos))
        words = self.sentence_encoder(x, mask)                                    # [S, T, H]
        words = words * mask[..., None]
        eos = (mask.long() * torch.arange(length, device=mask.device)).argmax(-1)  # last real token: the EOS
        hidden = words.shape[-1]
        vectors = words[torch.arange(len(rows), device=words.device), eos] + \
            self.position_embedding(sent_pos.reshape(-1).index_select(0, rows))   # [S, H]

        # document level: the sentence vectors of each document, [docs, sentences]
        grid = vectors.new_zeros(num_docs * width, hidden).index_copy(0, rows, vectors).view(num_docs, width, hidden)
        doc_keys = sentence_mask.clone()
        doc_keys[:, 0] |= ~sentence_mask.any(-1)   # a document without sentences: one key, so no row is all masked
        states = self.document_encoder(self.dropout(grid), doc_keys) * sentence_mask[..., None]

        token_states = None
        if output_token_states:
            token_states = words.new_zeros(num_docs * width, length, hidden).index_copy(0, rows, words)
            token_states = token_states.view(num_docs, width, length, hidden)
        out = HibertModelOutput(last_hidden_state=states, sentence_vectors=grid, token_states=token_states,
                                sentence_mask=sentence_mask, document_index=document_index)
        return out if _return_dict(self.config, return_dict) else out.to_tuple()


class HibertForSentenceLabelling(HibertPreTrainedModel):
    """Extractive summarization (HIBERT §3.3, eq. 8): a linear layer over each document-level sentence state;
    softmax over `num_labels` (label 1 = in the summary) or, with `config.sentence_head == "sigmoid"`, one logit."""

    _auto_class = "AutoModelForTokenClassification"

    def __init__(self, config: HibertConfig):
        super().__init__(config)
        self.sigmoid = config.sentence_head == "sigmoid"
        self.hibert = HibertModel(config)
        self.classifier = nn.Linear(config.hidden, 1 if self.sigmoid else config.num_labels)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.hibert.token_embedding

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.hibert.token_embedding = value

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, sentence_mask: Tensor | None = None,
                document_index: Tensor | None = None, labels: Tensor | None = None,
                return_dict: bool | None = None, **kwargs) -> HibertSentenceLabellingOutput | tuple:
        """`labels [docs, sentences]`: 0/1 per sentence, IGNORE_LABEL (-100) at rows to leave out (padding is left
        out anyway): the mean NLL (softmax) or binary cross-entropy (sigmoid), as the project trains."""
        enc = self.hibert(input_ids, attention_mask, sentence_mask, document_index, output_token_states=False,
                          return_dict=True)
        logits = self.classifier(enc.last_hidden_state)
        real = enc.sentence_mask
        if self.sigmoid:
            logits = logits.squeeze(-1)
            scores = logits.float().sigmoid()
        else:
            scores = logits.float().softmax(-1)[..., 1]
        scores = scores * real
        loss = None
        if labels is not None:
            labels = labels.to(logits.device).long().masked_fill(~real, IGNORE_LABEL)
            if self.sigmoid:
                valid = labels != IGNORE_LABEL
                per_row = F.binary_cross_entropy_with_logits(logits.float(), labels.float().clamp_min(0),
                                                             reduction="none")
                loss = (per_row * valid).sum() / valid.sum().clamp_min(1)
            else:
                loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_LABEL)
        out = HibertSentenceLabellingOutput(loss=loss, logits=logits, scores=scores,
                                            last_hidden_state=enc.last_hidden_state, sentence_mask=real,
                                            document_index=document_index)
        return out if _return_dict(self.config, return_dict) else out.to_tuple()
