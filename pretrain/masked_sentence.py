"""The masked-sentence pretraining task (HIBERT §3.2) for the shared training loop."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.modeling import HibertForPretraining, flops_per_batch
from hibert.modeling.pretraining import make_pretrain_batch_flat
from hibert.pretrain.objective import mask_batch
from hibert.runtime.task import LoaderItem, TokenNLLTask


class MaskedSentenceTask(TokenNLLTask):
    name = "masked_sentence"
    eval_metric = "valid_ppl"
    eval_mode = "min"

    def __init__(self, cfg: Config, vocab_size: int):
        self.cfg = cfg
        self.model_cfg = cfg.model.model_copy(update={"vocab_size": vocab_size})
        self.spec = cfg.objective
        self.seed = cfg.schedule.seed

    def model_config(self) -> ModelConfig:
        return self.model_cfg

    def build_model(self) -> torch.nn.Module:
        # run.init (the previous stage's encoder) is loaded by the runtime; fresh decoder, optimizer and schedule
        model = HibertForPretraining(self.model_cfg, label_smoothing=self.cfg.objective.label_smoothing)
        if self.cfg.deepspeed.zero_stage == 3 and self.model_cfg.tie_output_embeddings:
            import deepspeed  # only under ZeRO-3; importing it costs ~2.5 s

            # The tied output projection reads the token embedding outside the embedding's own forward:
            # ZeRO-3 must gather that partitioned weight for the whole model forward.
            deepspeed.zero.register_external_parameter(model, model.encoder.token_embedding.weight)
        return model

    def make_item(self, dataset, doc_indices: np.ndarray, epoch: int) -> LoaderItem:
        m = mask_batch(dataset, doc_indices, self.spec, self.seed, epoch)
        batch = make_pretrain_batch_flat(m.words, m.word_lens, m.doc_lens, m.target_rows, m.target_words,
                                         m.target_word_lens)
        d = batch.docs  # lengths incl. EOS per sentence, BOS.. / ..EOS per target
        flops = flops_per_batch(self.model_cfg, d.sent_lens, d.doc_lens, batch.target_lens, backward=True)
        return LoaderItem(batch, real_tokens=d.num_real_tokens + batch.num_target_tokens, flops=flops,
                          num_docs=len(doc_indices))

    def write_export_extras(self, out_dir, full_state: dict[str, torch.Tensor]) -> None:
        dec = {k[len("decoder."):]: v.contiguous() for k, v in full_state.items() if k.startswith("decoder.")}
        if dec:  # kept for inspection and continued pretraining; finetuning needs only the encoder
            save_file(dec, str(Path(out_dir) / "decoder.safetensors"))
