"""Extractive summarization finetuning on the shared runtime, ROUGE evaluation with baselines, summarize."""
