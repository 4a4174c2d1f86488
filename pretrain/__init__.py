"""Training runtime (distributed init, DeepSpeed engine, checkpoints, preemption, metrics) and the masked-sentence objective."""
