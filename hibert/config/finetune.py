"""`finetune:` section — which head `hibert finetune` trains and the head's training settings."""
from pydantic import Field

from hibert.config.base import Section


class FinetuneConfig(Section):
    # the head to train: a name registered in hibert/heads.py (checked there, so that a head registered
    # outside the project is a valid value). Built in: extractive / abstractive read documents (abstractive on
    # a cluster dataset = the flat baseline over the ranked units); ranker / mds read clusters (the
    # multi-document paragraph ranker and hierarchical summarizer)
    task: str = Field("extractive", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # abstractive (PreSumm's BertSumAbs recipe on HIBERT): the decoder learns at optimizer.lr with
    # schedule.warmup_steps; the pretrained encoder at optimizer.lr x encoder_lr_scale with its own warmup
    # (PreSumm: encoder 0.002 / 20k, decoder 0.2 / 10k -> encoder_lr_scale 0.01, encoder_warmup_steps 20000).
    # A random-init encoder learns like the decoder unless set otherwise.
    encoder_lr_scale: float = Field(1.0, ge=0.0)     # 0 = a frozen encoder (no requires_grad toggling)
    encoder_warmup_steps: int | None = Field(None, ge=0)  # None = schedule.warmup_steps
    max_target_tokens: int = Field(200, ge=4)        # summary subwords the decoder is trained on (incl. [SEP])
    eval_decode_docs: int = Field(64, ge=1)          # validation documents (clusters) decoded/ranked for model selection
    init_decoder: bool = False                       # decoder self-attention/FFN from the pretraining decoder
