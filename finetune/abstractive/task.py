"""Abstractive summarization on the shared training loop: HIBERT encoder + Transformer decoder (PreSumm's
BertSumAbs recipe applied to HIBERT), teacher-forced label-smoothed NLL of the summary subwords.

Two optimizer groups under the one schedule: the decoder at optimizer.lr with schedule.warmup_steps, the
(pretrained) encoder at optimizer.lr x finetune.encoder_lr_scale with finetune.encoder_warmup_steps.
Validation reports the teacher-forced loss of the whole split and the ROUGE of beam-search summaries of its
first `finetune.eval_decode_docs` documents; `valid_rouge` (mean of ROUGE-1/2/L F1) drives model
selection and early stopping. Decoding runs on rank 0 on a plain copy of the gathered fp32 weights, so
it works the same under every ZeRO stage (a ZeRO-3 forward is collective; beams end at different steps)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.errors import UserError
from hibert.finetune.abstractive.data import make_abstractive_batch, target_ids
from hibert.finetune.abstractive.settings import (
    DECODER_CONFIG,
    DECODER_WEIGHTS,
    GENERATION_CONFIG,
)
from hibert.finetune.base.task import EncoderHead, encoder_and_head_groups
from hibert.finetune.evaluation.rouge import Rouge
from hibert.finetune.inference.decoding import Decoder
from hibert.finetune.ranker.ranking import trained_mds_settings
from hibert.modeling import flops_per_batch
from hibert.modeling.abstractive import HibertAbstractive
from hibert.runtime.export import InitModel, gather_fp32_state_dict, read_weights
from hibert.runtime.task import EvalContext, LoaderItem, ParamGroup, TokenNLLTask


class AbstractiveTask(EncoderHead, TokenNLLTask):
    name = "abstractive"
    eval_metric = "valid_rouge"
    eval_mode = "max"

    def __init__(self, cfg: Config, model_cfg: ModelConfig):
        self.cfg, self.model_cfg = cfg, model_cfg
        self._word_start: np.ndarray | None = None
        self.reads_clusters = False   # the flat multi-document baseline: ranked units back to back
        if cfg.decoder.coverage:      # every rank has the same config: the stat all-reduces line up
            self.stat_keys = (*TokenNLLTask.stat_keys, "coverage_sum")

    # ---------------------------------------------------------------- model
    def new_model(self) -> torch.nn.Module:
        return HibertAbstractive(self.model_cfg, self.cfg.decoder)

    def build_model(self) -> torch.nn.Module:
        model = self.new_model()
        if self.cfg.deepspeed.zero_stage == 3:
            import deepspeed  # only under ZeRO-3; importing it costs ~2.5 s

            # The decoder reads the (tied) token table outside the embedding's own forward.
            deepspeed.zero.register_external_parameter(model, model.encoder.token_embedding.weight)
        return model

    def init_from(self, model: torch.nn.Module, init: InitModel | None) -> None:
        """The init export's encoder, and with finetune.init_decoder its masked-sentence decoder."""
        super().init_from(model, init)
        if self.cfg.finetune.init_decoder:
            model.load_pretraining_decoder(pretraining_decoder(self.cfg, init))

    def param_groups(self, model: torch.nn.Module, cfg: Config) -> list[ParamGroup]:
        return encoder_and_head_groups(model, cfg, "decoder.")

    # ---------------------------------------------------------------- data
    def make_item(self, dataset, doc_indices: np.ndarray, epoch: int) -> LoaderItem:
        docs, targets = [], []
        for i in doc_indices.tolist():
            summary = dataset.summary(i)
            if summary is None:
                raise ValueError(f"{dataset.split} document {dataset.doc_id(i)} has no summary: abstractive "
                                 "finetuning needs a corpus with summaries")
            docs.append(dataset[i])
            targets.append(target_ids(summary, self.cfg.finetune.max_target_tokens))
        batch = make_abstractive_batch(docs, targets)
        sent_lens = [len(s) + 1 for d in docs for s in d]
        target_lens = [len(t) + 1 for t in targets]
        # encoder + decoder self-attention/FFN FLOPs (cross-attention is not counted: MFU is a lower bound)
        flops = flops_per_batch(self.model_cfg, sent_lens, [len(d) for d in docs], target_lens, backward=True)
        return LoaderItem(batch, real_tokens=sum(sent_lens) + sum(target_lens), flops=flops, num_docs=len(docs),
                          extra={"doc_indices": doc_indices.tolist()})

    def forward_kwargs(self) -> dict:
        return {"label_smoothing": self.cfg.objective.label_smoothing}

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        metrics = super().evaluate(ctx)
        full = gather_fp32_state_dict(ctx.engine.module, "")
        box = [None]
        if ctx.is_main:
            box = [self.decode_rouge(full, ctx.valid_data, ctx.device)]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(box, src=0)  # every rank takes the same early-stopping decision
        return {**metrics, **box[0]}

    clusters = False   # the decoder reads documents (the mds task: clusters of units)

    def decode_inputs(self, data, idx: list[int]) -> tuple[list, list[np.ndarray] | None]:
        """What the decoder reads for rows `idx` of a validation view, and their unit graphs (none here)."""
        return [data[i] for i in idx], None

    def decode_rouge(self, state: dict[str, torch.Tensor], data, device: torch.device) -> dict[str, float]:
        """ROUGE of beam-search summaries of the first `eval_decode_docs` documents (clusters) of `data`."""
        model = self.new_model()
        model.load_state_dict(state)
        decoder = Decoder(model.to(device).eval(), data.tokenizer_path, self.cfg.generation, device,
                          clusters=self.clusters)
        idx = list(range(min(len(data), self.cfg.finetune.eval_decode_docs)))
        inputs, graphs = self.decode_inputs(data, idx)
        summaries = decoder.summarize_ids(inputs, graphs=graphs)
        refs = [[data.summary_text(i)] for i in idx]
        per_doc = Rouge(("rouge1", "rouge2", "rougeL")).score_corpus([s.sentences for s in summaries], refs)
        r = {m: float(v.mean()) for m, v in per_doc.items()}
        return {"valid_rouge1": r["rouge1_f"], "valid_rouge2": r["rouge2_f"], "valid_rougeL": r["rougeL_f"],
                "valid_rouge": (r["rouge1_f"] + r["rouge2_f"] + r["rougeL_f"]) / 3,
                "valid_summary_words": float(np.mean([len(" ".join(s.sentences).split()) for s in summaries]))}

    # ---------------------------------------------------------------- export
    def write_export_extras(self, out_dir, full_state: dict[str, torch.Tensor]) -> None:
        dec = {k: v.contiguous() for k, v in full_state.items() if not k.startswith("encoder.")}
        save_file(dec, str(Path(out_dir) / DECODER_WEIGHTS))
        settings = {"decoder": self.cfg.decoder.model_dump(mode="json"),
                    "max_target_tokens": self.cfg.finetune.max_target_tokens}
        if self.reads_clusters:  # how its units were ranked and cut, so evaluation reads them the same way

            settings["mds"] = trained_mds_settings(self.cfg)
        (Path(out_dir) / DECODER_CONFIG).write_text(json.dumps(settings, indent=1))
        (Path(out_dir) / GENERATION_CONFIG).write_text(json.dumps(self.cfg.generation.model_dump(mode="json"),
                                                                  indent=1))


def pretraining_decoder(cfg: Config, init: InitModel | None) -> dict[str, torch.Tensor]:
    """The masked-sentence decoder exported next to a pretrained encoder (finetune.init_decoder)."""
    path = None if init is None else Path(init.local_dir) / "decoder.safetensors"
    if path is None or not path.is_file():
        raise UserError(f"hibert finetune: finetune.init_decoder=true needs run.init to name a pretraining "
                        f"export with decoder.safetensors (run.init={cfg.run.init})")
    return read_weights(path)
