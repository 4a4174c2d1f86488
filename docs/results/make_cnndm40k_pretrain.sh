#!/usr/bin/env bash
# One pretraining unit of the cnndm-40k experiment (configs/recipes/cnndm-40k.yaml): pretraining seed P of an
# encoder arm, then its export copied to docs/results/encoders/cnndm40k-<arm>-p<P>/ (safetensors, model.json,
# tokenizer, export.json: what the finetuning units start from, in any later checkout) and its pretraining
# metrics (stage, steps, validation perplexity, tokens/s, minutes, and that none of the finetuning dataset's val/test
# articles is in its data) to docs/results/cnndm40k-pretrain-<arm>-p<P>.json. About 105 minutes on 2 cores.
#   bash docs/results/make_cnndm40k_pretrain.sh open-in P    # open-domain (900 steps) -> in-domain (one epoch)
#   bash docs/results/make_cnndm40k_pretrain.sh in-only P    # in-domain (one epoch) from random init
# Resumable: rerun the same command after an interruption (finished stages are reused, training resumes from
# its last checkpoint). Runs in runs/c40-<arm>-p<P>, data in runs/c40-data (shared by every unit).
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
ARM=${1:?arm: open-in or in-only}; P=${2:?pretraining seed}
case "$ARM" in
  open-in) STAGE=pretrain-in; STAGES=pretrain-open,pretrain-in ;;
  in-only) STAGE=pretrain-in-only; STAGES=pretrain-in-only ;;
  *) echo "arm: open-in or in-only" >&2; exit 2 ;;
esac
OUT=runs/c40-$ARM-p$P
# prep-cnndm: the finetuning dataset, whose val/test articles the record checks the pretraining data against
.venv/bin/hibert demo cnndm-40k "run.output_dir=$OUT" "run.seed=$P" "schedule.seed=$P" --stages "$STAGE,prep-cnndm"
.venv/bin/python -m hibert.pretrain.encoder_record "$OUT" "$STAGES" "docs/results/encoders/cnndm40k-$ARM-p$P" \
    "docs/results/cnndm40k-pretrain-$ARM-p$P.json" runs/c40-data/cnndm
