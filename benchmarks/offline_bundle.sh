#!/usr/bin/env bash
# Wheels for a GPU node that cannot reach a package index (air-gapped clusters, benchmark machines): every
# runtime dependency of this project for the node's Python on manylinux x86-64, the pure-Python ones that
# ship only as sdists (DeepSpeed, rouge-score) built here, minus what the node already has. Then, on the node:
#   python3 -m pip install --no-index --no-deps --target /tmp/site OUT/*.whl && export PYTHONPATH=/tmp/site
#
#   bash benchmarks/offline_bundle.sh [--suite] 3.12 .whl [installed.txt]
# installed.txt: names the node already has (one per line or comma-separated, e.g. `pip list` there); those
# are left out (torch always is: the node's CUDA build stays). Needs pip that reaches an index (or a mirror).
# --suite: what benchmarks/device_suite.sh imports and nothing more, small enough to travel with the working tree
# to a lent machine (its copy holds 64 MiB): MLflow's tracking client and SQL stores (mlflow-skinny + SQLAlchemy +
# Alembic) instead of the full mlflow, whose server, UI and data-science dependencies (pyarrow, scipy, pandas,
# scikit-learn, matplotlib) the suite never imports; pytest and pytest-timeout for its CUDA tests. It prints the
# bundle's size with the working tree's, against that limit, and fails above it. OUT is ignored by git (*.whl): name
# it in the device call's carry list (benchmarks/README.md, "What to carry").
set -euo pipefail
SUITE=0
if [ "${1:-}" = "--suite" ]; then SUITE=1; shift; fi
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
REQS=$("$PY" - "$HERE/pyproject.toml" "$SUITE" <<'EOF'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
suite = sys.argv[2] == "1"
import importlib.metadata as m
skip = {"torch", "deepspeed", "rouge-score", "stanza", "spacy", "datasets"}
if suite:   # evaluation's plots and statistics: not on the suite's path
    skip |= {"matplotlib", "scipy"}
name = lambda d: d.split(">")[0].split("=")[0].split("[")[0].strip().lower()  # noqa: E731
def pinned(d):
    # SentencePiece at this machine's version: the tokenizer the device suite trains must be the one the committed
    # CPU reference curve was made with (benchmarks/results/device_suite_reference_cpu.json), whatever the node has
    if name(d) == "sentencepiece":
        return f"sentencepiece=={m.version('sentencepiece')}"
    if name(d) == "mlflow" and suite:   # the same MLflow, its client and SQL stores only
        return (f"mlflow-skinny=={m.version('mlflow')} sqlalchemy=={m.version('sqlalchemy')} "
                f"alembic=={m.version('alembic')}")
    return d
print(" ".join(pinned(d) for d in deps if name(d) not in skip) + (" pytest pytest-timeout" if suite else ""))
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
# OUT/bundle.json: what was built (bare_node_check.sh records it); with --suite, the carried size against the limit
"$PY" - "$HERE" "$OUT" "$PY_VERSION" "$SUITE" "$INSTALLED" <<'EOF'
import json, subprocess, sys
from pathlib import Path
root, out, suite = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[4] == "1"
wheels = sorted(out.glob("*.whl"))
info = {"python": sys.argv[3], "suite": suite, "node_packages_left_out": sys.argv[5] or None,
        "wheels": len(wheels), "wheels_mib": round(sum(f.stat().st_size for f in wheels) / 2**20, 2)}
if suite:
    # what a device tool copies: the tracked files and the untracked ones git does not ignore, plus the bundle
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            check=True, capture_output=True).stdout.decode().split("\0")
    info["tree_mib"] = round(sum((root / f).stat().st_size for f in listed if f and (root / f).is_file()) / 2**20, 2)
    info["carried_mib"] = round(info["tree_mib"] + info["wheels_mib"], 2)
    info["limit_mib"] = 64
    print(f"carried: working tree {info['tree_mib']:.1f} MiB + {out} {info['wheels_mib']:.1f} MiB = "
          f"{info['carried_mib']:.1f} MiB (a device tool copies 64 MiB)")
(out / "bundle.json").write_text(json.dumps(info, indent=1) + "\n")
sys.exit(1 if suite and info["carried_mib"] > 64 else 0)
EOF
