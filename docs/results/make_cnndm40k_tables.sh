#!/usr/bin/env bash
# The cnndm-40k comparison from the committed units (no run directory needed): for each labelled set (full, 5k, 1k),
# every committed finetuning unit's seeds pooled by arm — random init; open+in-domain and in-domain-only, each over
# its pretraining seeds (one results file per pretraining seed) — with Lead-3 and the oracle, paired against random
# init over the 2,845 test articles and the seeds (hibert compare), into docs/results/cnndm40k-<labels>.json; then
# docs/tables.py renders docs/experiments.md. Units: make_cnndm40k_pretrain.sh, make_cnndm40k_finetune.sh.
#   bash docs/results/make_cnndm40k_tables.sh
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
R=docs/results
for LABELS in full 5k 1k; do
  [[ -f $R/cnndm40k-$LABELS-random.json ]] || { echo "$LABELS: no random-init unit committed yet"; continue; }
  ARGS=("random=$R/cnndm40k-$LABELS-random.json#random")
  for ARM in open-in in-only; do
    for F in "$R"/cnndm40k-"$LABELS"-"$ARM"-p*.json; do
      [[ -f $F ]] || continue
      UNIT=$(basename "$F" .json); UNIT=${UNIT#cnndm40k-$LABELS-}
      [[ $UNIT =~ ^$ARM-p[0-9]+$ ]] || continue   # a diagnostic arm (ARM_NAME=...-frozen) is not this arm
      ARGS+=("$ARM=$F#$UNIT")
    done
  done
  ARGS+=("lead3=$R/cnndm40k-$LABELS-random.json#lead3" "oracle=$R/cnndm40k-$LABELS-random.json#oracle")
  .venv/bin/hibert compare "${ARGS[@]}" --split test --allow-mixed-commits --results "$R/cnndm40k-$LABELS.json"
done
.venv/bin/python docs/tables.py
