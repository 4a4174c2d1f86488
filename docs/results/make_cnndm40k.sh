#!/usr/bin/env bash
# One pair of arms of the cnndm-40k experiment from a fresh clone beside ../shared: pretraining seed P through both
# stages (open-domain, then in-domain: make_cnndm40k_pretrain.sh, ~105 min on 2 cores, after ~10 min of data
# preparation), then its finetuned extractor and a random-init extractor with the same budget (seed P, LABELS
# labelled articles, default 1k: ~11 min each), compared on the 2,845 test articles into
# runs/c40-pair-p<P>/cnndm40k-pair-<LABELS>.json. Both exports are left where `hibert summarize --model` and `hibert evaluate`
# take them (printed at the end). About 2 hours on 2 cores at 1k labels; resumable: rerun the same command.
#   bash docs/results/make_cnndm40k.sh 1          # seed 1, 1,000 labelled articles
#   bash docs/results/make_cnndm40k.sh 2 full     # seed 2, all 39,361 (~30 min per finetuning)
# The pretraining writes its encoder and record to docs/results/ as the experiment's units do (for a committed
# seed, `git diff docs/results` then shows how closely the run reproduced it).
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
P=${1:?pretraining seed}; LABELS=${2:-1k}
bash docs/results/make_cnndm40k_pretrain.sh open-in "$P"
mkdir -p "runs/c40-pair-p$P"
for ARM in random "open-in-p$P"; do
  COMPARE=0 bash docs/results/make_cnndm40k_finetune.sh "$ARM" "$LABELS" "$P"
done
.venv/bin/hibert compare "open-in-p$P=runs/c40-ft/open-in-p$P-$LABELS/seed$P" "random=runs/c40-ft/random-$LABELS/seed$P" \
    "lead3=runs/c40-ft/random-$LABELS/seed$P#lead3" --split test --results "runs/c40-pair-p$P/cnndm40k-pair-$LABELS.json"
echo "exports (hibert summarize --model DIR): runs/c40-ft/open-in-p$P-$LABELS/seed$P/export" \
     "runs/c40-ft/random-$LABELS/seed$P/export"
