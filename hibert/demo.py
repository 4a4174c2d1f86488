"""`python -m hibert.demo [RECIPE] [overrides] [--fresh] [--stages A,B] ...` = `hibert demo ...`: the local
pipeline runner (slurm/local.py), reached through the CLI's command table like every other command."""
import sys

from hibert.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
