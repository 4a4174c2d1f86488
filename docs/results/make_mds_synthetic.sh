#!/usr/bin/env bash
# mds-synthetic at one commit (SYNTHETIC clusters: a CNN/DM article with its 3 tf-idf nearest neighbours of the
# same split, the target its own highlights; not multi-document summarization of real topics). The recipe's whole
# chain with finetuning seeds 1, 2, 3: one in-domain encoder (pretrained once: the comparisons here are between
# heads and readings of one encoder, and against random init), the paragraph ranker from it and from random init,
# then the summarizers reading the seed-1 HIBERT ranker's top units within 800 tokens: hierarchical PHT (HIBERT
# and random init), VHT, flat cross-attention, and the flat transformer over the same units. Every evaluation is
# on the 50 SYNTHETIC test clusters; the summarizers are also read at 1,600 tokens, and the rankers and the PHT /
# flat summarizers on the 11 real Multi-News clusters of ../shared (evaluation only). Results:
#   docs/results/mds-synthetic-rankers.json        tf-idf first: document order, the oracle, both rankers
#   docs/results/mds-synthetic-ranker-init.json    random-init ranker first: the HIBERT ranker
#   docs/results/mds-synthetic-summarizers.json    PHT (HIBERT) first: the other summarizers and the baselines
#   docs/results/mds-synthetic-summarizers-1600.json   the same five at 1,600 tokens
#   docs/results/mds-synthetic-multinews.json      rankers (document order first) on the 11 real clusters
#   docs/results/mds-synthetic-multinews-summaries.json   PHT (HIBERT) and the flat transformer on them, baselines
# rendered into docs/multi-document.md by docs/tables.py. About 4 h 30 min on 2 CPU cores (the chain ~4 h, the
# extra readings ~30 min). Finished stages are reused (the demo's markers), so the script can be stopped and
# started again in the same clone at the same commit; a stage stopped half-way is trained again from its start.
#
#   bash docs/results/make_mds_synthetic.sh    # runs/mds (the recipe's folder)
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
OUT=runs
RUN=$OUT/mds
PY=.venv/bin/python
HB=.venv/bin/hibert
SEEDS=(1 2 3)
mkdir -p "$OUT/data"

for s in train val test; do
  "$HB" synth-clusters --input ../shared/data/in_domain/cnndm_$s.jsonl --output "$OUT/data/cnndm_clusters_$s.jsonl" \
      --id-field idx --neighbours 3 > /dev/null
done
"$PY" -m hibert.demo mds-synthetic --seeds 1,2,3 > "$OUT/mds.log" 2>&1

seeds() { local name=$1 run=$2 sub=${3:-}; for S in "${SEEDS[@]}"; do echo "$name=$RUN/$run-seed$S${sub:+/$sub}"; done; }
SUMMARIZERS=(pht-hibert-init:mds-hibert vht:mds-vht flat-cross-attention:mds-flatx pht-random-init:mds-random
             flat-transformer:flat-hibert)
ranking() { [ "$1" = flat-hibert ] && echo "mds.ranking=models:/hibert-ranker@ranker-hibert"; true; }

# the extra readings: 1,600 tokens (every summarizer), the real Multi-News clusters (rankers, PHT, flat)
[ -f "$RUN/data/multinews_12/manifest.json" ] || "$HB" prep data=multinews_12 \
    "data.tokenizer.model=$RUN/data/open/tokenizer.model" "data.output=$RUN/data/multinews_12" > "$OUT/mds-extra.log" 2>&1
for S in "${SEEDS[@]}"; do
  for pair in "${SUMMARIZERS[@]}"; do
    run=${pair#*:}
    [ -f "$RUN/$run-seed$S/report-test-1600/report.json" ] || "$HB" evaluate mds-synthetic "run.name=$run-seed$S" \
        "data.dataset=$RUN/data/clusters" $(ranking "$run") --budget-tokens 1600 \
        --out "$RUN/$run-seed$S/report-test-1600" >> "$OUT/mds-extra.log" 2>&1
  done
  for run in ranker-hibert ranker-random mds-hibert flat-hibert; do
    [ -f "$RUN/$run-seed$S/report-test-multinews/report.json" ] || "$HB" evaluate mds-synthetic "run.name=$run-seed$S" \
        "data.dataset=$RUN/data/multinews_12" $(ranking "$run") \
        --out "$RUN/$run-seed$S/report-test-multinews" >> "$OUT/mds-extra.log" 2>&1
  done
done

ref=$RUN/ranker-hibert-seed1
# shellcheck disable=SC2046
"$HB" compare "tf-idf=$ref#tfidf" "document-order=$ref#document_order" "label-oracle=$ref#oracle" \
    $(seeds ranker-random-init ranker-random) $(seeds ranker-hibert-init ranker-hibert) \
    --split test --results docs/results/mds-synthetic-rankers.json > "$OUT/compare-mds-rankers.txt"
# shellcheck disable=SC2046
"$HB" compare $(seeds ranker-random-init ranker-random) $(seeds ranker-hibert-init ranker-hibert) \
    --split test --results docs/results/mds-synthetic-ranker-init.json > "$OUT/compare-mds-ranker-init.txt"
summ() {   # the five summarizers (PHT first), each seed's report in $1 ('' = report-test), then the baselines
  local sub=$1 args=() pair
  for pair in "${SUMMARIZERS[@]}"; do
    for S in "${SEEDS[@]}"; do args+=("${pair%%:*}=$RUN/${pair#*:}-seed$S${sub:+/$sub}"); done
  done
  local base=$RUN/mds-hibert-seed1${sub:+/$sub}
  args+=("lead3-first-document=$base#lead3_first_doc" "lead-gold-length=$base#lead_gold_length"
         "lead-ranked-units=$base#lead_ranked" "tf-idf-extract=$base#tfidf_extract")
  printf '%s\n' "${args[@]}"
}
mapfile -t A < <(summ "")
"$HB" compare "${A[@]}" --split test --results docs/results/mds-synthetic-summarizers.json \
    > "$OUT/compare-mds-summarizers.txt"
mapfile -t A < <(summ report-test-1600)
"$HB" compare "${A[@]}" --split test --results docs/results/mds-synthetic-summarizers-1600.json \
    > "$OUT/compare-mds-summarizers-1600.txt"
# shellcheck disable=SC2046
"$HB" compare "document-order=$ref/report-test-multinews#document_order" "tf-idf=$ref/report-test-multinews#tfidf" \
    $(seeds ranker-random-init ranker-random report-test-multinews) \
    $(seeds ranker-hibert-init ranker-hibert report-test-multinews) \
    --split test --results docs/results/mds-synthetic-multinews.json > "$OUT/compare-mds-multinews.txt"
# the summarizers read on the real clusters: PHT first, the flat transformer, the baselines of PHT's seed-1 report
mn=$RUN/mds-hibert-seed1/report-test-multinews
# shellcheck disable=SC2046
"$HB" compare $(seeds pht-hibert-init mds-hibert report-test-multinews) \
    $(seeds flat-transformer flat-hibert report-test-multinews) \
    "lead3-first-document=$mn#lead3_first_doc" "lead-gold-length=$mn#lead_gold_length" \
    "lead-ranked-units=$mn#lead_ranked" "tf-idf-extract=$mn#tfidf_extract" \
    --split test --results docs/results/mds-synthetic-multinews-summaries.json \
    > "$OUT/compare-mds-multinews-summaries.txt"
"$PY" docs/tables.py
echo "made at $(git rev-parse --short HEAD): docs/results/mds-synthetic-*.json, docs/multi-document.md"
