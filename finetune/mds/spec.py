"""The multi-document summarizer's registration (Liu & Lapata 2019 on HIBERT): ranked units of a cluster ->
local and global layers -> decoder. Its parts load on first use (`lazy`)."""
from hibert.config.abstractive import DecoderConfig, GenerationConfig
from hibert.config.mds import MDSConfig
from hibert.finetune.abstractive.spec import DECODING, check_config
from hibert.heads import HeadSpec, lazy, register_head

SPEC = register_head(HeadSpec(
    name="mds", title="multi-document summarizer", registered_model="hibert-mds",
    build_task=lazy("hibert.finetune.mds.head:build_task"), evaluate=lazy("hibert.finetune.mds.head:evaluate"),
    summarizer=lazy("hibert.finetune.mds.summarize:summarizer"),
    load=lazy("hibert.finetune.mds.export:load_mds"),
    config={"decoder": DecoderConfig, "generation": GenerationConfig, "mds": MDSConfig}, check_config=check_config,
    inference=DECODING, reads="clusters", decodes=True,
    export_files=("decoder.safetensors", "abstractive.json", "generation.json", "mds.json")))
