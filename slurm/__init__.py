"""sbatch scripts rendered from a recipe's `slurm:` section, and `hibert submit` for the staged chain."""
