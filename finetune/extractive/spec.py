"""The extractive head's registration: sentence labelling on documents (HIBERT §3.3). Its parts load on first
use (`lazy`): registering costs what the config needs, not torch."""
from hibert.finetune.extractive.settings import ExtractiveSelection, stored_selection
from hibert.heads import HeadSpec, Inference, lazy, register_head

SPEC = register_head(HeadSpec(
    name="extractive", title="extractive finetuning", registered_model="hibert-extractive",
    build_task=lazy("hibert.finetune.extractive.head:build_task"),
    evaluate=lazy("hibert.finetune.extractive.evaluate:evaluate"),
    summarizer=lazy("hibert.finetune.extractive.summarize:summarizer"),
    load=lazy("hibert.finetune.extractive.export:load_extractive"),
    inference=Inference(ExtractiveSelection, stored_selection, title="extraction (extractive models; default: "
                        "the model's extractive.json)"),
    export_files=("head.safetensors", "extractive.json")))
