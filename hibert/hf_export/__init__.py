"""`hibert export-hf`: an encoder export (or a `models:/` reference) -> a Hugging Face folder that
`transformers.AutoModel.from_pretrained(folder, trust_remote_code=True)` loads and `huggingface-cli upload` takes.
remote/ holds the folder's remote code (torch, sentencepiece and transformers only); it is copied, never imported
by the project, which does not depend on transformers (the `hf` extra installs it for loading the folder)."""
