"""HIBERT configuration for Hugging Face `transformers` (remote code, `trust_remote_code=True`).

Written by `hibert export-hf` next to the weights; self-contained (torch and transformers only). The field names
are the training project's own `model:` section (model.json); the usual Hugging Face names (`hidden_size`,
`num_hidden_layers`, `num_attention_heads`, `intermediate_size`) are aliases of them.
"""
from transformers import PretrainedConfig


class HibertConfig(PretrainedConfig):
    """Sizes of the hierarchical document encoder HIBERT (Zhang et al. 2019, §3.1): a sentence encoder and a
    document encoder of `layers` Transformer layers each, hidden size `hidden`, `heads` attention heads, FFN width
    `ffn`; one sinusoidal table of `max_positions` rows for word and sentence positions; post-LN unless
    `norm_first`. `sentence_head` ("softmax" with `num_labels` labels, or "sigmoid") describes the extractive head
    of a finetuned model (HibertForSentenceLabelling); `extractive_selection` how the project picks sentences with
    it (top_k, trigram_blocking)."""

    model_type = "hibert"
    attribute_map = {"hidden_size": "hidden", "num_hidden_layers": "layers", "num_attention_heads": "heads",
                     "intermediate_size": "ffn", "max_position_embeddings": "max_positions"}

    def __init__(self, vocab_size=32000, hidden=512, layers=6, heads=8, ffn=None, dropout=0.1, max_positions=512,
                 norm_first=False, activation="relu", layer_norm_eps=1e-5, sentence_head=None,
                 extractive_selection=None, pad_token_id=0, bos_token_id=2, eos_token_id=3, **kwargs):
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', not {activation!r}")
        if sentence_head not in (None, "softmax", "sigmoid"):
            raise ValueError(f"sentence_head must be None, 'softmax' or 'sigmoid', not {sentence_head!r}")
        self.vocab_size = vocab_size
        self.hidden = hidden
        self.layers = layers
        self.heads = heads
        self.ffn = ffn if ffn is not None else 4 * hidden
        self.dropout = dropout
        self.max_positions = max_positions
        self.norm_first = norm_first
        self.activation = activation
        self.layer_norm_eps = layer_norm_eps
        self.sentence_head = sentence_head
        self.extractive_selection = extractive_selection
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)
