#!/usr/bin/env bash
# One finetuning unit of the cnndm-40k experiment (configs/recipes/cnndm-40k-finetune.yaml): one arm's extractive
# finetunings over its seeds on one labelled set, each evaluated on the 2,845 CNN/DM 40k test articles, then
# compared (with Lead-3 and the oracle) into docs/results/cnndm40k-<labels>-<arm>.json. The pooled comparison of
# every committed unit is docs/results/make_cnndm40k_tables.sh.
#   bash docs/results/make_cnndm40k_finetune.sh random 1k 1,2,3
#   bash docs/results/make_cnndm40k_finetune.sh open-in-p1 full 1,2,3     # starts from docs/results/encoders/cnndm40k-open-in-p1
# ARM: random, or <encoder arm>-p<pretraining seed> of a committed encoder; LABELS: full (39,361), 5k, 1k.
# Extra overrides after the seeds (e.g. optimizer.lr=5e-4) are passed to every finetuning; name the arm for them
# with ARM_NAME=... so that its runs and results file are its own; COMPARE=0 trains and evaluates without writing
# the comparison (make_cnndm40k.sh compares its pair itself). Resumable: rerun the same command.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
ARM=${1:?arm}; LABELS=${2:?labels: full, 5k or 1k}; SEEDS=${3:?seeds, e.g. 1,2,3}; shift 3
NAME=${ARM_NAME:-$ARM}
TOKENIZER=${TOKENIZER:-docs/results/encoders/cnndm40k-tokenizer.model}
case "$LABELS" in
  full) DATA=runs/c40-data/cnndm; SUBSET=(); STEPS=1200 ;;
  5k) DATA=runs/c40-data/cnndm_5k; SUBSET=(data.sources.0.sample_fraction=0.127); STEPS=800 ;;
  1k) DATA=runs/c40-data/cnndm_1k; SUBSET=(data.sources.0.sample_fraction=0.0254); STEPS=400 ;;
  *) echo "labels: full, 5k or 1k" >&2; exit 2 ;;
esac
INIT=()
if [[ $ARM != random ]]; then
  ENC=docs/results/encoders/cnndm40k-$ARM
  [[ -f $ENC/encoder.safetensors ]] || { echo "no encoder $ENC (run make_cnndm40k_pretrain.sh first)" >&2; exit 2; }
  INIT=("run.init=$ENC")
fi
PY=.venv/bin/python
"$PY" -m hibert.cli prep cnndm-40k-finetune "data.output=$DATA" "data.tokenizer.model=$TOKENIZER" "${SUBSET[@]}" \
    --no-progress
OUT=runs/c40-ft/$NAME-$LABELS
SYSTEMS=()
for S in ${SEEDS//,/ }; do
  COMMON=(cnndm-40k-finetune "run.output_dir=$OUT" "run.name=seed$S" "data.output=$DATA" "${SUBSET[@]}")
  if [[ ! -f $OUT/seed$S/export/export.json ]]; then
    "$PY" -m hibert.cli finetune "${COMMON[@]}" "${INIT[@]}" "run.seed=$S" "schedule.seed=$S" \
        "schedule.max_steps=$STEPS" tracking.register_model=false "$@" --nproc 2
  fi
  [[ -f $OUT/seed$S/report-test/report.json ]] || "$PY" -m hibert.cli evaluate "${COMMON[@]}" --split test
  SYSTEMS+=("$NAME=$OUT/seed$S")
done
[[ ${COMPARE:-1} == 1 ]] || exit 0
REF=${SYSTEMS[0]#*=}
.venv/bin/hibert compare "${SYSTEMS[@]}" "lead3=$REF#lead3" "oracle=$REF#oracle" --split test \
    --results "docs/results/cnndm40k-$LABELS-$NAME.json"
