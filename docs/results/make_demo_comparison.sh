#!/usr/bin/env bash
# The demo's "does pretraining help?" comparison at one commit, with pretraining seeds: the demo recipe run with
# run.seed = schedule.seed = P for P in 1 2 3 (open-domain + in-domain pretraining once per P), each pretrained
# encoder finetuned with seeds 1, 2, 3 (extractive and abstractive heads), and the random-init baselines with
# the same finetuning seeds (once: they do not depend on P). The extractive models are evaluated on the demo's
# test split, on 1,014 held-out CNN/DM articles (configs/data/cnndm_heldout.yaml) and on the same articles
# with their byline lines removed (configs/data/cnndm_heldout_clean.yaml, data_prep/bylines.py); every
# comparison is written to docs/results/ (hibert compare --results) and rendered into docs/experiments.md by
# docs/tables.py. About 35 minutes on 2 CPU cores.
#
#   bash docs/results/make_demo_comparison.sh [OUT]      # OUT: default runs/exp
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/exp}
PY=.venv/bin/python
HIBERT=(.venv/bin/hibert)
SEEDS=(1 2 3)
mkdir -p "$OUT" runs/data

for P in "${SEEDS[@]}"; do
  # P=1 runs every stage; P=2, 3 only the pretrained arms (the random-init ones would be the same runs again)
  stages=()
  [ "$P" != 1 ] && stages=(--stages finetune,evaluate,finetune-abs,evaluate-abs)
  "$PY" -m hibert.demo demo "run.output_dir=$OUT/demo-p$P" "run.seed=$P" "schedule.seed=$P" --seeds 1,2,3 \
      "${stages[@]}" > "$OUT/demo-p$P.log" 2>&1
done

# held-out CNN/DM articles, as they are and without their bylines, prepared with the demo's tokenizer
{ tail -n +201 ../shared/data/in_domain/cnndm_train.jsonl; cat ../shared/data/in_domain/cnndm_test.jsonl; } \
    > runs/data/cnndm_heldout.jsonl
"$PY" -m hibert.data_prep.bylines runs/data/cnndm_heldout.jsonl runs/data/cnndm_heldout_clean.jsonl
tok="$OUT/demo-p1/data/open/tokenizer.model"
"${HIBERT[@]}" prep demo data=cnndm_heldout "data.tokenizer.model=$tok" "data.output=$OUT/data/heldout" \
    > "$OUT/prep-heldout.log" 2>&1
"${HIBERT[@]}" prep demo data=cnndm_heldout_clean "data.tokenizer.model=$tok" "data.output=$OUT/data/heldout-clean" \
    > "$OUT/prep-heldout-clean.log" 2>&1

pre=() rand=() pre_abs=() rand_abs=()
for P in "${SEEDS[@]}"; do for S in "${SEEDS[@]}"; do
  pre+=("$OUT/demo-p$P/finetune-seed$S"); pre_abs+=("$OUT/demo-p$P/finetune-abs-seed$S")
done; done
for S in "${SEEDS[@]}"; do rand+=("$OUT/demo-p1/finetune-random-seed$S"); rand_abs+=("$OUT/demo-p1/finetune-abs-random-seed$S"); done

for set in heldout heldout-clean; do
  for run in "${pre[@]}" "${rand[@]}"; do
    "${HIBERT[@]}" evaluate demo "run.output_dir=$(dirname "$run")" "run.name=$(basename "$run")" \
        "data.dataset=$OUT/data/$set" --split test --out "$run/report-$set" --bootstrap 200 \
        >> "$OUT/evaluate-$set.log" 2>&1
  done
done

commit=$(git rev-parse --short HEAD)
join() { local name=$1; shift; local out=(); for r in "$@"; do out+=("$name=$r"); done; echo "${out[@]}"; }
for set in test heldout heldout-clean; do
  # shellcheck disable=SC2046
  "${HIBERT[@]}" compare $(join random "${rand[@]}") $(join pretrained "${pre[@]}") \
      "lead3=${rand[0]}#lead3" "position=${rand[0]}#position" "oracle=${rand[0]}#oracle" \
      --split "$set" --results "docs/results/demo-extractive-$set.json" > "$OUT/compare-$set.txt"
done
# shellcheck disable=SC2046
"${HIBERT[@]}" compare $(join random "${rand_abs[@]}") $(join pretrained "${pre_abs[@]}") \
    --split test --results docs/results/demo-abstractive-test.json > "$OUT/compare-abstractive-test.txt"
"$PY" docs/tables.py
echo "made at $commit: docs/results/demo-*.json, docs/experiments.md"
