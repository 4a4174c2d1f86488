#!/usr/bin/env bash
# Wheels for a GPU node that cannot reach a package index (air-gapped clusters, benchmark machines): every
# runtime dependency of this project for the node's Python on manylinux x86-64, the pure-Python ones that
# ship only as sdists (DeepSpeed, rouge-score) built here, minus what the node already has. Then, on the node:
#   python3 -m pip install --no-index --no-deps --target /tmp/site OUT/*.whl && export PYTHONPATH=/tmp/site
#
#   bash benchmarks/offline_bundle.sh 3.12 .whl [installed.txt]
# installed.txt: names the node already has (one per line or comma-separated, e.g. `pip list` there); those
# are left out (torch always is: the node's CUDA build stays). Needs pip that reaches an index (or a mirror).
set -euo pipefail
PY_VERSION=${1:?python version of the node, e.g. 3.12}
OUT=${2:?output directory}
INSTALLED=${3:-}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT"

PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
# what the runtime imports (pretrain / finetune / evaluate); data prep (stanza, spacy, datasets) runs on CPU nodes
REQS=$("$PY" - "$HERE/pyproject.toml" <<'EOF'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
import importlib.metadata as m
skip = {"torch", "deepspeed", "rouge-score", "stanza", "spacy", "datasets"}
name = lambda d: d.split(">")[0].split("=")[0].split("[")[0].strip().lower()  # noqa: E731
# SentencePiece at this machine's version: the tokenizer the device suite trains must be the one the committed CPU
# reference curve was made with (benchmarks/results/device_suite_reference_cpu.json), whatever the node has
print(" ".join(f"sentencepiece=={m.version('sentencepiece')}" if name(d) == "sentencepiece" else d
               for d in deps if name(d) not in skip))
EOF
)
DS_VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('deepspeed'))")
"$PY" -m pip download -q --only-binary=:all: --python-version "$PY_VERSION" --implementation cp "${PLATFORMS[@]}" \
    -d "$TMP/wheels" $REQS hjson py-cpuinfo nvidia-ml-py einops msgpack ninja psutil nltk absl-py six
# sdist-only, pure Python: built here (DeepSpeed without its ops: they JIT-compile on the node when used)
"$PY" -m pip download -q --no-deps --no-binary=:all: -d "$TMP/sdist" "deepspeed==$DS_VERSION" \
    "rouge-score==$("$PY" -c "import importlib.metadata as m; print(m.version('rouge-score'))")"
for sdist in "$TMP"/sdist/*; do
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$TMP/wheels" "$sdist"
done

"$PY" - "$TMP/wheels" "$OUT" "$INSTALLED" <<'EOF'
import re, shutil, sys
from pathlib import Path

src, out, installed = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
norm = lambda s: re.sub(r"[-_.]+", "-", s.strip().lower())  # noqa: E731
have = {"torch", "triton"} | {norm(n) for n in re.split(r"[,\n]", Path(installed).read_text())
                             if n.strip()} if installed else {"torch", "triton"}
have = {h.split()[0] for h in have if h} - {"sentencepiece"}  # `pip list` lines: "name version"; see REQS
kept, size = [], 0
for whl in sorted(src.glob("*.whl")):
    if norm(whl.name.split("-")[0]) in have or norm(whl.name.split("-")[0]).startswith("nvidia-"):
        continue
    shutil.copy2(whl, out / whl.name)
    kept.append(whl.name)
    size += whl.stat().st_size
print(f"{len(kept)} wheels, {size / 2**20:.1f} MiB in {out}")
EOF
