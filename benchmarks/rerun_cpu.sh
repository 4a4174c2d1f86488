#!/usr/bin/env bash
# Every CPU benchmark whose numbers README.md and docs/*.md quote, rerun at one commit on a quiet machine, each
# written to the results file the pages read (benchmarks/results/, with machine.commit). The GPU files
# (bench_*_cuda*.json) come from the device suite; the measured one-GPU step behind projection_scaling.json is
# bench_modeling_cuda.json, so the projection is recomputed here from it.
#
#   bash benchmarks/rerun_cpu.sh                 # everything (~2 h on 2 cores, nothing else running)
#   bash benchmarks/rerun_cpu.sh oracle prep     # some of them (names below)
#
# A benchmark whose file already records this commit (and a clean tree) is kept, so an interrupted rerun goes on
# where it stopped. Refuses a tree with uncommitted changes: a number must be reproducible from its commit. Logs in
# runs/bench/<name>.log. The node benchmark needs the local Slurm cluster (`bash .ci/slurm_up.sh`).
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
HB=${HB:-.venv/bin/hibert}
R=benchmarks/results
LOGS=runs/bench
HEAD=$(git rev-parse HEAD)
mkdir -p "$LOGS"
if [ -n "$(git status --porcelain --untracked-files=no -- . ':(exclude)benchmarks/results')" ]; then
  echo "rerun_cpu.sh: uncommitted changes to tracked files; commit them first" >&2
  exit 2
fi

ALL=(oracle prep segment bare-node generate generate-noblock mds summarize loader scale-prep scale-loader scale-nodes
     projection)
WANT=("$@")
[ ${#WANT[@]} -gt 0 ] || WANT=("${ALL[@]}")
for name in "${WANT[@]}"; do   # a misspelt name fails now, not after hours of the others
  [[ " ${ALL[*]} " == *" $name "* ]] || { echo "rerun_cpu.sh: no benchmark '$name' (${ALL[*]})" >&2; exit 2; }
done
FAILED=()

at_head() {   # whether $1 already records this commit and a clean tree
  "$PY" - "$1" "$HEAD" <<'EOF' 2>/dev/null
import json, sys
m = json.load(open(sys.argv[1])).get("machine") or {}
sys.exit(0 if m.get("commit") == sys.argv[2] and m.get("tracked_changes") is False else 1)
EOF
}

bench() {   # bench NAME OUT COMMAND...: run COMMAND unless OUT is already at this commit; a failure is counted,
  local name=$1 out=$2  # the others still run
  shift 2
  if at_head "$out"; then echo "[rerun] $name: $out already at ${HEAD:0:7}"; return 0; fi
  echo "[rerun] $name -> $out (log: $LOGS/$name.log)"
  local t0=$SECONDS
  if "$@" > "$LOGS/$name.log" 2>&1; then
    echo "[rerun] $name done in $((SECONDS - t0)) s"
  else
    echo "[rerun] $name FAILED after $((SECONDS - t0)) s: $LOGS/$name.log" >&2
    FAILED+=("$name")
  fi
}

news_dataset() {   # the CNN/DM + BBC articles as abstractive-gain prepares them at this commit: the loader's input
  local stamp=$LOGS/news/.commit
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$HEAD" ] && return 0
  rm -rf "$LOGS/news"
  "$HB" prep abstractive-gain data=news "data.output=$LOGS/news" > "$LOGS/news-prep.log" 2>&1 || {
    echo "[rerun] loader: preparing its dataset FAILED: $LOGS/news-prep.log" >&2; return 1; }
  echo "$HEAD" > "$stamp"
}

for name in "${WANT[@]}"; do
  case $name in
    oracle) bench oracle $R/bench_oracle.json "$PY" benchmarks/bench_oracle.py --out $R/bench_oracle.json ;;
    prep) bench prep $R/bench_prep.json "$PY" benchmarks/bench_prep.py --out $R/bench_prep.json ;;
    segment) bench segment $R/bench_segment_cpu.json "$PY" benchmarks/bench_segment.py --out $R/bench_segment_cpu.json ;;
    bare-node) bench bare-node $R/device_suite_bare_cpu.json bash benchmarks/bare_node_check.sh ;;
    generate) bench generate $R/bench_generate_cpu.json \
        "$PY" benchmarks/bench_generate.py --out $R/bench_generate_cpu.json ;;
    generate-noblock) bench generate-noblock $R/bench_generate_cpu_noblock.json \
        "$PY" benchmarks/bench_generate.py --no-repeat-ngram 0 --cross flat --skip cache,memory \
        --out $R/bench_generate_cpu_noblock.json ;;
    mds) bench mds $R/bench_mds_cpu.json "$PY" benchmarks/bench_mds.py --out $R/bench_mds_cpu.json ;;
    summarize) bench summarize $R/bench_summarize_cpu.json \
        "$PY" benchmarks/bench_summarize.py --out $R/bench_summarize_cpu.json ;;
    loader) news_dataset || { FAILED+=(loader); continue; }
      bench loader $R/bench_loader_cpu.json "$PY" benchmarks/bench_loader.py --dataset "$LOGS/news" \
        --workers 0 1 2 --repeats 3 --out $R/bench_loader_cpu.json ;;
    scale-prep) bench scale-prep $R/bench_scale_prep_cpu.json "$PY" benchmarks/bench_scale.py \
        --sizes 10MB,100MB,1GB --workers 2 --skip loader --out $R/bench_scale_prep_cpu.json ;;
    scale-loader) bench scale-loader $R/bench_scale_loader_cpu.json "$PY" benchmarks/bench_scale.py \
        --sizes 10MB --skip prep --shard-counts 10,1000,10000 --out $R/bench_scale_loader_cpu.json ;;
    scale-nodes) bench scale-nodes $R/bench_scale_nodes_cpu.json "$PY" benchmarks/bench_scale.py \
        --sizes 100MB --skip prep,loader --slurm-size 100MB --out $R/bench_scale_nodes_cpu.json ;;
    projection) bench projection $R/projection_scaling.json "$PY" benchmarks/project_scaling.py \
        --out $R/projection_scaling.json ;;
  esac
done
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "[rerun] at ${HEAD:0:7}: FAILED ${FAILED[*]} (logs in $LOGS); the others are written" >&2
  exit 1
fi
echo "[rerun] at ${HEAD:0:7}; render the pages: python docs/tables.py"
