#!/usr/bin/env bash
# The one command for a lent GPU machine, in order of value within a 420 s budget (set-up included): environment,
# end-to-end pretraining (HIBERT_M bf16 ZeRO-1, ZeRO-1 compiled, ZeRO-2: steady-state tokens/s and MFU), profile,
# loss curve against the committed CPU reference, CUDA tests, kill -9 + resume, bench_mds; one JSON per step and
# summary.json in $OUT (the device tool sets it), else --out DIR, else runs/device-suite. The steps are in
# benchmarks/device_suite.py (`--help`); this only finds the interpreter. Carry the two ignored paths it needs with
# the tree: .whl (offline_bundle.sh --suite) and runs/device-suite-source.json (--stamp).
#   bash benchmarks/device_suite.sh [--wheels .whl]          # on the GPU machine
#   bash benchmarks/device_suite.sh --dry-run --out /tmp/ds  # the same steps on CPU, tiny sizes (< 5 min, 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
# this checkout's virtualenv where there is one (not carried to a device), else the machine's python3
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec "$PY" benchmarks/device_suite.py "$@"
