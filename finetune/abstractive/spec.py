"""The abstractive head's registration: HIBERT encoder + Transformer decoder on documents (the first chunk of
each), or — on a cluster dataset — the flat multi-document baseline reading the ranked units back to back.
Its parts load on first use (`lazy`): registering costs what the config needs, not torch."""
from hibert.config.abstractive import DecoderConfig, GenerationConfig, check_decoder
from hibert.config.mds import MDSConfig, check_mds
from hibert.finetune.abstractive.settings import check_generation, stored_generation
from hibert.heads import HeadSpec, Inference, lazy, register_head

# the decoding settings of the abstractive and multi-document heads (their exports' generation.json)
DECODING = Inference(GenerationConfig, stored_generation, check_generation,
                     title="decoding (models with a decoder; default: the model's generation.json)")


def check_config(cfg) -> None:
    check_decoder(cfg)
    check_mds(cfg)


SPEC = register_head(HeadSpec(
    name="abstractive", title="abstractive finetuning", registered_model="hibert-abstractive",
    build_task=lazy("hibert.finetune.abstractive.head:build_task"),
    evaluate=lazy("hibert.finetune.abstractive.evaluate:evaluate"),
    summarizer=lazy("hibert.finetune.abstractive.summarize:summarizer"),
    load=lazy("hibert.finetune.abstractive.export:load_abstractive"),
    config={"decoder": DecoderConfig, "generation": GenerationConfig, "mds": MDSConfig}, check_config=check_config,
    inference=DECODING, decodes=True,
    export_files=("decoder.safetensors", "abstractive.json", "generation.json")))
