#!/usr/bin/env bash
# A lent GPU machine starts bare: its own Python and torch, no package index, the checkout copied as it is. This
# rehearses that start here, before any device is lent: a virtualenv holding only torch (the CPU wheel), the device
# suite's wheels for this Python (`offline_bundle.sh --suite`), and the suite's dry run with `--wheels` from the
# checkout, not installed. It also builds the bundle for the device's Python (3.12 unless given) to measure what
# travels. Writes benchmarks/results/device_suite_bare_cpu.json: both bundles (wheels, MiB, with the working tree,
# against the 64 MiB a device tool copies) and the dry run's steps; exits 1 when a step fails or the bundle is too big.
#   bash benchmarks/bare_node_check.sh [DEVICE_PYTHON] [OUT_JSON]
#   BARE_PYTHON=/path/to/python3.12 bash benchmarks/bare_node_check.sh   # the bare venv from another interpreter
#     (the device's version: the index may then give torch's CUDA build, as a GPU image has; CUDA stays unused)
# Needs a package index (or mirror) for the wheels and torch, like offline_bundle.sh; TORCH_INDEX (e.g.
# https://download.pytorch.org/whl/cpu) where the default index would give the CUDA build. About 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONPATH   # bare: nothing but the virtualenv's own packages and the carried wheels
DEVICE_PY=${1:-3.12}
OUT=${2:-benchmarks/results/device_suite_bare_cpu.json}
PY=${PYTHON:-.venv/bin/python}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOWN="${BARE_PYTHON:+BARE_PYTHON=$BARE_PYTHON }bash benchmarks/bare_node_check.sh $*"   # the command, as recorded
BARE_PYTHON=${BARE_PYTHON:-$("$PY" -c "import sys; print(sys._base_executable)")}   # default: this checkout's Python
LOCAL_PY=$("$BARE_PYTHON" -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
TORCH=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")

echo "[bare] Python $LOCAL_PY virtualenv with torch==$TORCH only"
"$BARE_PYTHON" -m venv "$TMP/bare"
"$TMP/bare/bin/python" -m pip install -q "torch==$TORCH" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
BARE_TORCH=$("$TMP/bare/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null)
echo "[bare] suite bundles: Python $LOCAL_PY (the run) and $DEVICE_PY (the device's)"
bash benchmarks/offline_bundle.sh --suite "$LOCAL_PY" "$TMP/whl-local" > "$TMP/bundle-local.log" 2>&1 \
  || { tail -20 "$TMP/bundle-local.log"; exit 1; }
bash benchmarks/offline_bundle.sh --suite "$DEVICE_PY" "$TMP/whl-device" > "$TMP/bundle-device.log" 2>&1 \
  || { tail -20 "$TMP/bundle-device.log"; exit 1; }
grep -h "^carried" "$TMP/bundle-local.log" "$TMP/bundle-device.log"
echo "[bare] device suite dry run with --wheels"
set +e
PYTHON="$TMP/bare/bin/python" bash benchmarks/device_suite.sh --dry-run --wheels "$TMP/whl-local" --out "$TMP/ds" \
  --work "$TMP/work" > "$TMP/suite.log" 2>&1
set -e
tail -12 "$TMP/suite.log"

"$PY" - "$TMP" "$OUT" "$DEVICE_PY" "$LOCAL_PY" "$SHOWN" "$BARE_TORCH" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from workload import machine, write_results   # noqa: E402

tmp, out, device_py, local_py = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
summary = json.loads((tmp / "ds" / "summary.json").read_text())
env = json.loads((tmp / "ds" / "1_environment.json").read_text())
setup = env.get("setup") or {}
result = {"machine": {**machine(), "command": sys.argv[5].strip()},
          "bundle": {"device": json.loads((tmp / "whl-device" / "bundle.json").read_text()),
                     "local": json.loads((tmp / "whl-local" / "bundle.json").read_text())},
          "interpreter": {"python": local_py, "torch": sys.argv[6], "packages": "torch only (a virtualenv)"},
          "setup": {"wheels_installed": (setup.get("wheels") or {}).get("count"),
                    "wheels_installer": (setup.get("wheels") or {}).get("installer"),   # pip, or unpacked
                    "hibert_installed": setup.get("hibert_installed"), "missing": setup.get("missing"),
                    "hibert_from_link_tree": "package/hibert" in str(setup.get("hibert_from"))},
          "total_s": summary["total_s"], "ok": summary["ok"],
          "steps": [{k: s[k] for k in ("step", "status", "seconds", "headline", "reason")} for s in summary["steps"]]}
write_results(out, result)
sys.exit(0 if summary["ok"] and all(b.get("carried_mib", 0) <= 64 for b in result["bundle"].values()) else 1)
EOF
