"""Benchmark workloads: in-memory documents with the real sentence/document lengths of CNN/DM."""
from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
GIGA_CM_WORDS = 2_854e6   # Zhang et al. 2019, §4.1: GIGA-CM's 2,854M words (~6.6M documents)


def cnndm_lengths(path: Path | None = None, max_tokens: int = 50, max_sents: int = 30,
                  limit: int | None = None) -> list[list[int]]:
    """Sentence lengths per document chunk: split on ' . ' (the PTB-tokenized text), whitespace tokens,
    truncate at `max_tokens`, chunk at `max_sents` — the limits the real pipeline applies."""
    path = path or SHARED / "in_domain" / "cnndm_train.jsonl"
    docs: list[list[int]] = []
    with open(path) as f:
        for line in f:
            art = json.loads(line)["article"]
            lens = [min(max_tokens, len(s.split()) + 1) for s in re.split(r"(?<= \.) ", art) if s.strip()]
            docs += [lens[i:i + max_sents] for i in range(0, len(lens), max_sents)]
            if limit and len(docs) >= limit:
                break
    return docs


class LengthsDataset:
    """A DocumentDataset look-alike: random token ids with given lengths (only lengths matter for speed)."""

    def __init__(self, lengths: list[list[int]], vocab: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.docs = [[rng.integers(6, vocab, size=n).astype(np.int32) for n in d] for d in lengths]
        self.doc_num_sentences = np.array([len(d) for d in self.docs])
        self.doc_num_tokens = np.array([sum(len(s) for s in d) for d in self.docs])
        self.tokenizer_path = Path("/nonexistent")

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> list[np.ndarray]:
        return self.docs[i]


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "cpu": platform.processor() or "unknown"}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:  # the last-level cache decides how much batching shares on a CPU (docs/abstractive.md)
        info["l3_cache"] = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    info.update(source_revision(), command=run_command())
    return info


def run_command() -> str:
    """The command line this benchmark runs as, its script relative to the repository (what a page shows)."""
    repo = Path(__file__).resolve().parents[1]
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(repo) if script.is_relative_to(repo) else Path(sys.argv[0])
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def source_revision() -> dict:
    """The commit the benchmark ran at and whether tracked files other than results differed from it (a number
    from a dirty tree cannot be reproduced from the commit alone); empty outside a git checkout."""
    repo = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        # results written by an earlier benchmark (tracked files under benchmarks/results) are not source changes
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)benchmarks/results"], cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    if head.returncode != 0:
        return {}
    return {"commit": head.stdout.strip(), "tracked_changes": bool(dirty.stdout.strip())}


def write_results(path: Path, result: dict) -> int:
    """The benchmark's JSON (with when it finished) at `path`; the exit status of a finished benchmark."""
    result.setdefault("finished", time.strftime("%Y-%m-%dT%H:%M:%S"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"results: {path}")
    return 0
