#!/usr/bin/env bash
# Diagnostic arms of the cnndm-40k experiment: what the pretrained encoder brings by itself. The encoder frozen
# (finetune.encoder_lr_scale=0: only the extractive head trains, a linear probe of the document encoder's sentence
# states) from random init and from pretraining seed P, on LABELS labelled articles (default 1k), finetuning seed 1
# (SEEDS to add more), each compared on the 2,845 test articles; then the two frozen arms paired into
# docs/results/cnndm40k-<labels>-frozen.json. Resumable: rerun the same command.
#   bash docs/results/make_cnndm40k_diagnostics.sh 1 [1k] [SEEDS]
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
P=${1:?pretraining seed}; LABELS=${2:-1k}; SEEDS=${3:-1}
F=docs/results/make_cnndm40k_finetune.sh
ARM_NAME=random-frozen bash $F random "$LABELS" "$SEEDS" finetune.encoder_lr_scale=0
ARM_NAME="open-in-p$P-frozen" bash $F "open-in-p$P" "$LABELS" "$SEEDS" finetune.encoder_lr_scale=0
R=docs/results
.venv/bin/hibert compare "random-frozen=$R/cnndm40k-$LABELS-random-frozen.json#random-frozen" \
    "open-in-frozen=$R/cnndm40k-$LABELS-open-in-p$P-frozen.json#open-in-p$P-frozen" \
    "lead3=$R/cnndm40k-$LABELS-random-frozen.json#lead3" --split test --results "$R/cnndm40k-$LABELS-frozen.json"
