#!/usr/bin/env bash
# pretrain-gain on BBC, with the encoders of make_pretrain_gain.sh: run it after that script, in the same clone
# at the same commit, and every pretraining (the staged encoder's three seeds, the in-domain-only encoder) is
# reused from its folders; here the BBC data is prepared with each folder's tokenizer and the extractive head
# finetuned on BBC (1,882 training articles) with seeds 1, 2, 3 from each encoder and from random init, then
# evaluated on the 108 BBC test articles (references are copied article sentences). One comparison is written
# to docs/results/pretrain-gain-bbc.json and rendered into docs/experiments.md by docs/tables.py. About 50 min on
# 2 CPU cores after make_pretrain_gain.sh (15 finetunings of ~3 min).
#
#   bash docs/results/make_pretrain_gain_bbc.sh      # runs/gain, runs/gain-p2, runs/gain-p3
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
OUT=runs
PY=.venv/bin/python
SEEDS=(1 2 3)

"$PY" -m hibert.demo pretrain-gain --seeds 1,2,3 \
    --stages ft-bbc-random,ev-bbc-random,ft-bbc-in-only,ev-bbc-in-only,ft-bbc-open-in,ev-bbc-open-in \
    > "$OUT/gain-bbc.log" 2>&1
for P in 2 3; do
  "$PY" -m hibert.demo pretrain-gain "run.output_dir=$OUT/gain-p$P" "run.seed=$P" "schedule.seed=$P" --seeds 1,2,3 \
      --stages ft-bbc-open-in,ev-bbc-open-in > "$OUT/gain-bbc-p$P.log" 2>&1
done

sys() { local name=$1 dir=$2 arm=$3; for S in "${SEEDS[@]}"; do echo "$name=$dir/ft-bbc-$arm-seed$S"; done; }
ref="$OUT/gain/ft-bbc-random-seed1"
# shellcheck disable=SC2046
.venv/bin/hibert compare $(sys random "$OUT/gain" random) $(sys in-only "$OUT/gain" in-only) \
    $(sys open-in "$OUT/gain" open-in) $(sys open-in "$OUT/gain-p2" open-in) $(sys open-in "$OUT/gain-p3" open-in) \
    "lead3=$ref#lead3" "position=$ref#position" "oracle=$ref#oracle" \
    --split test --results docs/results/pretrain-gain-bbc.json > "$OUT/compare-pretrain-gain-bbc.txt"
"$PY" docs/tables.py
echo "made at $(git rev-parse --short HEAD): docs/results/pretrain-gain-bbc.json, docs/experiments.md"
