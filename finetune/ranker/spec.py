"""The unit ranker's registration (Liu & Lapata 2019 §3): scores every unit of a cluster; it ranks, it does
not summarize. Its parts load on first use (`lazy`)."""
from hibert.config.mds import MDSConfig, check_mds
from hibert.heads import HeadSpec, lazy, register_head

SPEC = register_head(HeadSpec(
    name="ranker", title="unit ranker", registered_model="hibert-ranker",
    build_task=lazy("hibert.finetune.ranker.head:build_task"),
    evaluate=lazy("hibert.finetune.ranker.evaluate:evaluate"),
    load=lazy("hibert.finetune.ranker.export:load_ranker"),
    config={"mds": MDSConfig}, check_config=check_mds, reads="clusters",
    report_lines=lazy("hibert.finetune.ranker.evaluate:report_lines"),
    export_files=("ranker.safetensors", "ranker.json")))
