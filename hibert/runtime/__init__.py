"""The one training runtime every task runs on: distributed set-up (torchrun / deepspeed / Slurm), the
DeepSpeed engine, token-budget batches, the loop and its components (step log, validation, checkpoints with
exact resume, preemption), MLflow tracking, export and registry. It belongs to no task: pretraining
(pretrain/) and every finetuning head (finetune/) plug in a `Task` (task.py). `run.py` is the entry a
command uses. Kept import-light on purpose: `hibert.runtime.batching` must not pull DeepSpeed."""
