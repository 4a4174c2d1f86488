#!/usr/bin/env bash
# abstractive-gain on BBC, with the encoders of make_abstractive_gain.sh: run it after that script, in the same
# clone, and the three in-domain pretrainings are reused from their folders (runs/absgain, -p2, -p3); here the BBC
# data is prepared with each folder's tokenizer and the abstractive head finetuned on BBC (1,882 training
# articles, the recipe's 8 epochs) with seeds 1, 2, 3 from each encoder and from random init, then decoded with
# the recipe's settings on the 108 BBC test articles (their references are copied article sentences: a test of
# reading and copying, not of abstraction). One comparison is written to docs/results/abstractive-gain-bbc.json
# and rendered into docs/experiments.md by docs/tables.py. Twelve abstractive finetunings on 2 CPU cores.
#
#   bash docs/results/make_abstractive_gain_bbc.sh    # runs/absgain, runs/absgain-p2, runs/absgain-p3
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
OUT=runs
PY=.venv/bin/python
SEEDS=(1 2 3)

"$PY" -m hibert.demo abstractive-gain --seeds 1,2,3 \
    --stages abs-bbc-random,ev-abs-bbc-random,abs-bbc-hibert,ev-abs-bbc-hibert > "$OUT/absgain-bbc.log" 2>&1
for P in 2 3; do
  "$PY" -m hibert.demo abstractive-gain "run.output_dir=$OUT/absgain-p$P" "run.seed=$P" "schedule.seed=$P" \
      --seeds 1,2,3 --stages abs-bbc-hibert,ev-abs-bbc-hibert > "$OUT/absgain-bbc-p$P.log" 2>&1
done

sys() { local name=$1 dir=$2 arm=$3; for S in "${SEEDS[@]}"; do echo "$name=$dir/abs-bbc-$arm-seed$S"; done; }
ref="$OUT/absgain/abs-bbc-random-seed1"
# shellcheck disable=SC2046
.venv/bin/hibert compare $(sys random "$OUT/absgain" random) $(sys hibert "$OUT/absgain" hibert) \
    $(sys hibert "$OUT/absgain-p2" hibert) $(sys hibert "$OUT/absgain-p3" hibert) \
    "lead3=$ref#lead3" "oracle=$ref#oracle" \
    --split test --results docs/results/abstractive-gain-bbc.json > "$OUT/compare-abstractive-gain-bbc.txt"
"$PY" docs/tables.py
echo "made at $(git rev-parse --short HEAD): docs/results/abstractive-gain-bbc.json, docs/experiments.md"
