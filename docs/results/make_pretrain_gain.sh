#!/usr/bin/env bash
# pretrain-gain on CNN/DM at one commit, with pretraining seeds for the staged encoder: the recipe's open-domain ->
# in-domain encoder pretrained three times (run.seed = schedule.seed = the recipe's 1234, then 2, then 3; each
# with its own prep, tokenizer and MLflow store under its own folder), each finetuned on CNN/DM with seeds 1, 2, 3;
# the in-domain-only encoder pretrained once and the random-init extractor (it does not depend on a pretraining
# seed), each finetuned with seeds 1, 2, 3; all evaluated on the 50 CNN/DM test documents. The BBC arms of the
# recipe are not run here. One comparison is written to docs/results/pretrain-gain-cnndm.json and rendered into
# docs/experiments.md by docs/tables.py. About 1 h 30 min on 2 CPU cores (the first folder ~40 min: three
# pretrainings and nine finetunings; each further pretraining seed ~23 min).
#
#   bash docs/results/make_pretrain_gain.sh      # runs/gain (the recipe's folder), runs/gain-p2, runs/gain-p3
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
OUT=runs
PY=.venv/bin/python
SEEDS=(1 2 3)

# pretraining seed 1234 (the recipe's): every CNN/DM arm
"$PY" -m hibert.demo pretrain-gain --seeds 1,2,3 \
    --stages ft-cnndm-random,ev-cnndm-random,ft-cnndm-in-only,ev-cnndm-in-only,ft-cnndm-open-in,ev-cnndm-open-in \
    > "$OUT/gain.log" 2>&1
# pretraining seeds 2 and 3: the staged (open + in-domain) encoder and its finetunings
for P in 2 3; do
  "$PY" -m hibert.demo pretrain-gain "run.output_dir=$OUT/gain-p$P" "run.seed=$P" "schedule.seed=$P" --seeds 1,2,3 \
      --stages ft-cnndm-open-in,ev-cnndm-open-in > "$OUT/gain-p$P.log" 2>&1
done

sys() { local name=$1 dir=$2 arm=$3; for S in "${SEEDS[@]}"; do echo "$name=$dir/ft-cnndm-$arm-seed$S"; done; }
ref="$OUT/gain/ft-cnndm-random-seed1"
# shellcheck disable=SC2046
.venv/bin/hibert compare $(sys random "$OUT/gain" random) $(sys in-only "$OUT/gain" in-only) \
    $(sys open-in "$OUT/gain" open-in) $(sys open-in "$OUT/gain-p2" open-in) $(sys open-in "$OUT/gain-p3" open-in) \
    "lead3=$ref#lead3" "position=$ref#position" "oracle=$ref#oracle" \
    --split test --results docs/results/pretrain-gain-cnndm.json > "$OUT/compare-pretrain-gain-cnndm.txt"
"$PY" docs/tables.py
echo "made at $(git rev-parse --short HEAD): docs/results/pretrain-gain-cnndm.json, docs/experiments.md"
