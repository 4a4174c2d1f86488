#!/usr/bin/env bash
# The one command for a lent GPU machine: environment, CUDA tests, end-to-end pretraining (HIBERT_M bf16 ZeRO-1/2),
# loss curve against the committed CPU reference, profile, kill -9 + resume, bench_mds; one JSON per step and
# summary.json in $OUT (the device tool sets it), else --out DIR, else runs/device-suite. The steps are in
# benchmarks/device_suite.py (`--help`); this only finds the interpreter.
#   bash benchmarks/device_suite.sh [--wheels .whl]          # on the GPU machine
#   bash benchmarks/device_suite.sh --dry-run --out /tmp/ds  # the same steps on CPU, tiny sizes (< 5 min, 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
# this checkout's virtualenv where there is one (not carried to a device), else the machine's python3
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec "$PY" benchmarks/device_suite.py "$@"
