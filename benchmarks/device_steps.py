"""Steps 2-7 of the device suite (benchmarks/device_suite.py runs each in its own process) and `--make-reference`.

Everything trains through the real runtime: `hibert pretrain` (DeepSpeed engine, the shard loader with its
workers, checkpoints, MLflow in a local sqlite store) on a corpus generated here from the shipped CNN/DM samples'
sentences (PTB-tokenized, so prep needs no segmenter: the device image has neither stanza nor spaCy). Numbers are
read back from what the run logged to MLflow, as a user would read them. Sizes: `DEVICE` on the GPU, `DRY` in the
CPU dry run; the loss-curve configurations (`CURVES`) are the ones the committed CPU reference was made with.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from device_mfu import logged_lines, peak_tflops, read_record, steady_windows
from device_suite import HERE, REPO, Context, Report, machine_block
from device_suite import STEPS as SUITE_STEPS
from timed_run import dynamo_counts, tf32_possible
from safetensors.torch import load_file
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile
from workload import write_results

from hibert.config import load_config
from hibert.data_prep import DocumentDataset
from hibert.data_prep.tokenizer import vocab_size
from hibert.pretrain.masked_sentence import MaskedSentenceTask
from hibert.registry import client
from hibert.runtime.batching import doc_costs, plan_epoch
from hibert.runtime.metrics import default_peak_tflops
from hibert.runtime.run import prepare_run
from hibert.runtime.trainer import Trainer

REFERENCE = HERE / "results" / "device_suite_reference_cpu.json"
SAMPLES = [REPO / "samples" / f"cnndm_{split}_sample.jsonl" for split in ("train", "val", "test")]
HOST_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")

# Step 4's tolerances.
# fp32 on the GPU against the CPU curve, at every logged step: with dropout off, the same data, masks and initial
# weights (checked by fingerprint first), the runs differ only in the order of floating-point sums (other kernels):
# ~1e-6 relative per operation. Adam turns such noise on near-zero gradients into lr-sized steps of a few weights
# (the key bias, whose true gradient is 0), which moves the loss by ~1e-4..1e-3 relative over 20 steps. What the
# tolerance catches and what it cannot (FP32_COMPARISON): reduced precision moves the curve by less than it, so the
# step pins fp32 matmuls to IEEE fp32 in its runs and records the state they ran with.
FP32_CURVE_RTOL = 0.005
FP32_COMPARISON = {
    "catches": "a defect that moves the fp32 loss by more than 0.5% at any step against the CPU's: a wrong mask, "
               "offset or sequence boundary in the GPU's variable-length attention or in packing, a wrong gradient, "
               "loss or optimizer step, data or masks that differ from the reference's (fingerprinted first)",
    "does_not_catch": "reduced matmul precision: TF32 (10-bit mantissa, ~1e-3 relative per product) or a bf16 op "
                      "inside the fp32 path moves a 20-step curve by ~1e-4..3e-3, inside the tolerance; nor a "
                      "defect smaller than 0.5% over 20 steps",
    "instead": "both runs pin fp32 matmuls to IEEE fp32 (benchmarks/timed_run.py --pin-fp32: "
               "set_float32_matmul_precision('highest'), cuda.matmul.allow_tf32 and cudnn.allow_tf32 False, "
               "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE unset, NVIDIA_TF32_OVERRIDE=0); `matmul_precision` is what each run "
               "had at its first step, and the step fails where the fp32 run could have used TF32"}
# bf16 against fp32 on the GPU, the end of the curve (mean of the last 3 steps): bf16 rounds each value to 8 bits of
# mantissa (~0.4%), but a loss averages ~1e4 token terms and the master weights and Adam stay fp32 (DeepSpeed's
# ZeRO-1/2 bf16; its gradients are bf16 — `data_types.grad_accum_dtype` unset — which one GPU and one micro-batch
# per step do not accumulate), so over a short run the curves stay within a few tenths of a percent; an overflow,
# a lost gradient or a half-precision optimizer shows as several percent.
BF16_END_RTOL = 0.01
# Step 6 on CUDA: some kernels accumulate with atomics (embedding / index_add / attention backward), so even two
# uninterrupted runs differ in their last bits, and Adam carries that on: the resumed run is compared to the
# uninterrupted one within these (a broken resume - optimizer state, lr schedule, data position or RNG not
# restored - moves the weights by a fraction of what training moved them comparable to 1, and the loss by far
# more than 1%). On CPU the resume must be bit-identical, as tests/test_pretrain_deepspeed.py checks.
RESUME_LOSS_RTOL = 0.01
RESUME_DRIFT_MAX = 0.05


@dataclass(frozen=True)
class Corpus:
    """Documents resampled from the CNN/DM samples' sentences (real sentences and document lengths)."""
    docs: int
    vocab: int
    seed: int = 0
    pinned: bool = True      # one prep worker and one shard: the same dataset on every machine

    @property
    def name(self) -> str:
        return f"cnndm-{self.docs}d-v{self.vocab}-s{self.seed}"


@dataclass(frozen=True)
class Sizes:
    corpus: Corpus
    model: str
    precision: str
    batch_tokens: int
    steps: int               # step 2, logged every `log_every`: the first window warms up, the rest are timed
    log_every: int
    loader_workers: int
    profile_warm: int
    profile_steps: int
    resume_steps: int
    resume_every: int        # checkpoint cadence; the run is killed after the first one
    mds_args: tuple[str, ...]
    run_reserve_s: int       # step 2: what each run still to come keeps of the step's box


# GPU: HIBERT_M bf16 micro-batches of 65,536 tokens (~70 documents), as docs/performance.md's command; the corpus
# (~4.8M tokens, vocab ~12k: what the samples' 16k word types allow) holds step 2's 60 steps in one epoch: 5 timed
# windows of 9 steps after the warm-up window.
DEVICE = Sizes(Corpus(6000, 32000, pinned=False), "hibert_m", "bf16", 65536, 60, 10, 4, 5, 3, 8, 4,
               ("--device", "cuda", "--precision", "bf16", "--hidden", "512", "--batch", "8",
                "--lengths", "800", "1600", "3000", "6000", "--threads", str(min(16, os.cpu_count() or 1))), 35)
DRY = Sizes(Corpus(120, 1000), "hibert_tiny", "fp32", 1500, 9, 3, 1, 2, 2, 8, 4,
            ("--hidden", "32", "--batch", "1", "--repeats", "1", "--threads", "2"), 20)
READ_S = 6   # what reading a run's numbers takes: a run is stopped this long before its step's box ends


@dataclass(frozen=True)
class Curve:
    """Step 4's run: fp32 (and bf16) from the same data, masks and initial weights, dropout off."""
    corpus: Corpus
    model: str
    batch_tokens: int
    max_docs: int
    steps: int
    lr: float
    warmup: int


CURVES = {"device": Curve(Corpus(300, 2000), "hibert_s", 2048, 64, 20, 5e-4, 5),
          "dry_run": Curve(DRY.corpus, "hibert_tiny", 1500, 16, 8, 1e-3, 2)}


def sizes(ctx: Context) -> Sizes:
    return DRY if ctx.dry_run else DEVICE


# ------------------------------------------------------------------------------------------ data and runs
def write_corpus(path: Path, spec: Corpus) -> None:
    """JSONL of `spec.docs` documents: sentence counts of real articles, sentences drawn from all of them."""
    articles = [json.loads(line)["article"] for f in SAMPLES for line in f.open(encoding="utf-8")]
    docs = [[s for s in re.split(r"(?<= [.!?]) ", a) if s.strip()] for a in articles]
    pool, counts = [s for d in docs for s in d], [len(d) for d in docs]
    rng = np.random.default_rng(spec.seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(spec.docs):
            picks = rng.integers(len(pool), size=counts[rng.integers(len(counts))])
            f.write(json.dumps({"idx": i, "article": " ".join(pool[j] for j in picks)}) + "\n")


def corpus(ctx: Context, spec: Corpus) -> Path:
    """The prepared dataset (made once per work directory; a step that needs it first makes it)."""
    out = ctx.work / "data" / spec.name
    if (out / ".ready").is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".jsonl")
    write_corpus(src, spec)
    workers = 1 if spec.pinned else min(8, os.cpu_count() or 1)
    hibert_cli(ctx, ["prep", f"data.output={out}", f"data.tokenizer.vocab_size={spec.vocab}",
                 "data.tokenizer.hard_vocab_limit=false", "data.tokenizer.sample_sentences=30000",
                 "data.valid_fraction=0.05", "data.test_fraction=0.0", f"data.workers={workers}",
                 f"data.num_shards={workers}",
                 (f"data.sources=[{{format: jsonl, path: '{src}', text_field: article, id_field: idx, "
                  "ptb_tokenized: true}]")], ctx.work / "logs" / f"prep-{spec.name}.log", ctx.left())
    (out / ".ready").touch()
    return out


def describe(data: Path) -> dict[str, Any]:
    train, valid = DocumentDataset(data, "train"), DocumentDataset(data, "valid")
    return {"name": data.name, "train_chunks": len(train), "valid_chunks": len(valid),
            "train_tokens": int(train.doc_num_tokens.sum()), "vocab": vocab_size(train.tokenizer_path)}


def hibert_cli(ctx: Context, args: list[str], log: Path, timeout: float) -> float:
    """`hibert ARGS` to completion (its output in `log`); seconds. Raises with the log's end on failure."""
    t0 = time.time()
    with log.open("w") as f:
        code = subprocess.run([sys.executable, "-m", "hibert.cli", *args], stdout=f, stderr=subprocess.STDOUT,
                              timeout=timeout, cwd=REPO).returncode
    if code != 0:
        raise RuntimeError(f"hibert {args[0]} exited {code}: {log.read_text(errors='replace')[-1500:]}")
    return time.time() - t0


def store(ctx: Context, root: Path) -> str:
    """A migrated MLflow sqlite store under `root` (a copy of one made once: a fresh store's migrations cost
    seconds per run), as tests/conftest.py seeds its runs' stores."""
    template = ctx.work / "mlflow-template.db"
    if not template.is_file():
        make = "import mlflow, sys; mlflow.MlflowClient(sys.argv[1]).search_experiments()"
        subprocess.run([sys.executable, "-c", make, f"sqlite:///{template}"], check=True, capture_output=True,
                       timeout=ctx.left())
    db = root / "mlflow.db"
    if not db.exists():
        root.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, db)
    return f"sqlite:///{db}"


@dataclass
class Run:
    root: Path
    name: str
    code: int | None         # None: stopped at its deadline
    wall_s: float
    log: Path
    record: Path | None = None   # timed_run.py's per-step lines

    @property
    def dir(self) -> Path:
        return self.root / self.name

    def tail(self, n: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def history(self) -> dict[str, list[tuple[int, float]]]:
        """Every metric the run logged to MLflow, (step, value) in step order (a step logged twice shows twice)."""
        c = client(f"sqlite:///{self.root / 'mlflow.db'}")
        exp = c.get_experiment_by_name("hibert")
        runs = c.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{self.name}'") if exp else []
        if not runs:
            raise RuntimeError(f"no MLflow run {self.name} in {self.root / 'mlflow.db'}")
        rid = runs[0].info.run_id
        return {k: sorted((m.step, m.value) for m in c.get_metric_history(rid, k)) for k in runs[0].data.metrics}


def pretrain_args(root: Path, name: str, data: Path, settings: dict[str, Any]) -> list[str]:
    """`hibert pretrain` with this suite's defaults: the run's own store, no registration, evaluation and the only
    checkpoint at the end (a step sets what it measures)."""
    base = {"run.output_dir": root, "run.name": name, "data.dataset": data,
            "tracking.uri": f"sqlite:///{root / 'mlflow.db'}",
            "tracking.register_model": "false", "schedule.eval_every": 0, "schedule.eval_batches": 2,
            "schedule.epochs": 100, "checkpoint.keep_best": 0, "checkpoint.every_steps": 0,
            "checkpoint.resume": "never", "run.collective_timeout_s": 300}
    return ["pretrain", *(f"{k}={v}" for k, v in {**base, **settings}.items())]


def start(ctx: Context, root: Path, name: str, data: Path, settings: dict[str, Any], tag: str = "",
          record: bool = False, pin_fp32: bool = False) -> tuple[subprocess.Popen, Path, Path | None]:
    """`hibert pretrain` through timed_run.py: with `record`, its per-step lines beside the log; `pin_fp32`: IEEE
    fp32 matmuls whatever the environment says."""
    log = ctx.work / "logs" / f"{root.name}-{name}{tag}.log"
    rec = log.with_suffix(".steps.jsonl") if record else None
    store(ctx, root)
    wrapper = [str(HERE / "timed_run.py"), *(["--record", str(rec)] if rec else []), *(["--pin-fp32"] * pin_fp32)]
    f = log.open("w")
    proc = subprocess.Popen([sys.executable, *wrapper, *pretrain_args(root, name, data, settings)], stdout=f,
                            stderr=subprocess.STDOUT, cwd=REPO)
    f.close()
    return proc, log, rec


def finish_run(proc: subprocess.Popen, deadline: float) -> int | None:
    """The run's exit status, or None where it was still running at `deadline` (then killed: its checkpoint on
    SIGTERM would cost the seconds its numbers are read in)."""
    try:
        return proc.wait(timeout=max(deadline - time.time(), 0.1))
    except subprocess.TimeoutExpired:
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def pretrain_run(ctx: Context, root: Path, name: str, data: Path, settings: dict[str, Any], tag: str = "",
                 deadline: float | None = None, record: bool = False) -> Run:
    """A run to its end or to `deadline` (default: its step's box less READ_S), whichever is first."""
    t0 = time.time()
    proc, log, rec = start(ctx, root, name, data, settings, tag, record)
    code = finish_run(proc, deadline or ctx.deadline - READ_S)
    return Run(root, name, code, time.time() - t0, log, rec)


def speed_settings(s: Sizes, zero: int, **extra: Any) -> dict[str, Any]:
    return {"model": s.model, "deepspeed.zero_stage": zero, "deepspeed.precision": s.precision,
            "schedule.batch_tokens": s.batch_tokens, "schedule.max_steps": s.steps, "schedule.log_every": s.log_every,
            "schedule.warmup_steps": 100, "data.num_workers_loader": s.loader_workers, **extra}


TUNED = {"deepspeed.torch_compile": True, "deepspeed.check_finite_grads": False}


def _last(history: dict[str, list[tuple[int, float]]], key: str) -> float | None:
    return history[key][-1][1] if history.get(key) else None


def _sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()[:16]


def _gib(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**30, 3) if path.is_dir() else 0.0


# ------------------------------------------------------------------------------------------ step 5
def cuda_test_files() -> list[Path]:
    """tests/test_*cuda*.py, and any test module that skips as a whole without CUDA (pytestmark)."""
    found = set(REPO.glob("tests/test_*cuda*.py"))
    marked = re.compile(r"^pytestmark\s*=.*(cuda\.is_available\(\)|mark\.cuda\b)", re.MULTILINE)
    found |= {p for p in REPO.glob("tests/test_*.py") if marked.search(p.read_text(encoding="utf-8"))}
    return sorted(found)


def junit_cases(xml: Path) -> list[dict[str, Any]]:
    cases = []
    for case in ET.parse(xml).getroot().iter("testcase") if xml.is_file() else []:
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            el = case.find(kind)
            if el is not None:
                outcome, message = kind, (el.get("message") or el.text or "")[:300]
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": round(float(case.get("time") or 0), 2), "message": message})
    return cases


# each CUDA test gets at most this long (pytest-timeout; the project's 300 s would eat the step's box)
CUDA_TEST_TIMEOUT_S = 60
INTERRUPT_S = 8   # pytest interrupted at the box (SIGINT) ends its session and writes its XML within this


def run_pytest(cmd: list[str], timeout: float) -> tuple[int | str, str]:
    """pytest's exit status ("timeout": interrupted at `timeout`) and output. Interrupted with SIGINT, as ^C: it
    then reports the tests it ran and writes its junit XML (a SIGKILL would leave no XML)."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = proc.communicate(timeout=max(timeout, 1))[0]
        return proc.returncode, out or ""
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out = proc.communicate(timeout=INTERRUPT_S)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        return "timeout", out or ""


def cuda_tests(report: Report, ctx: Context) -> None:
    """Two pytest runs: the tests that compile (a cold inductor start each) after every other one, so that a slow
    compile never costs the other tests their outcomes; each run's junit XML is read even when its box ran out."""
    files = cuda_test_files()
    t0 = time.time()
    cases: list[dict[str, Any]] = []
    tails, exits, commands = [], [], []
    for part, select in (("rest", "not compile"), ("compile", "compile")):
        xml = ctx.work / f"cuda-tests-{part}.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", f"--junitxml={xml}",
               "-o", f"timeout={CUDA_TEST_TIMEOUT_S}", "-k", select, *(str(f.relative_to(REPO)) for f in files)]
        commands.append(" ".join(cmd[1:]))
        code, stdout = run_pytest(cmd, ctx.left() - INTERRUPT_S - 4)   # time to stop it and read what it wrote
        exits.append(code)
        tails.append(stdout[-1500:] if code not in (0, 5) or part == "rest" else stdout[-300:])
        cases += junit_cases(xml)
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failure", "error", "skipped")}
    report.update(files=[str(f.relative_to(REPO)) for f in files], commands=commands, exits=exits,
                  counts=counts, seconds_pytest=round(time.time() - t0, 1),
                  tests=[c for c in cases if c["outcome"] != "passed"] + [c for c in cases if c["outcome"] == "passed"],
                  output_tail="\n".join(tails)[-2500:])
    head = f"{counts['passed']} passed, {counts['failure'] + counts['error']} failed, {counts['skipped']} skipped"
    if not cases:
        report.finish("failed", "no test ran", f"pytest exits {exits}: {tails[0][-800:]}")
    elif "timeout" in exits:
        report.finish("failed", head, "the step's box ran out while pytest ran (outcomes: what the XML holds)")
    elif counts["failure"] or counts["error"] or any(x not in (0, 5) for x in exits):
        report.finish("failed", head, "a CUDA test failed")
    elif counts["passed"] == 0 and not torch.cuda.is_available():
        report.finish("skipped", head, f"no CUDA: {len(cases)} tests collected from {len(files)} files, all skipped")
    elif counts["passed"] == 0:
        report.finish("failed", head, "CUDA is here but every test skipped")
    else:
        report.finish("passed", head)


# ------------------------------------------------------------------------------------------ step 2
def device_peak() -> dict[str, Any]:
    """The peak MFU is counted against (hibert/runtime/peak_flops.py's rules), and what the runtime takes where
    tracking.peak_tflops is not set (the same rules: the two must agree)."""
    if not torch.cuda.is_available():
        return {"tflops": None, "rule": "no CUDA: MFU not computed"}
    props = torch.cuda.get_device_properties(0)
    peak = peak_tflops(props.name, round(props.total_memory / 2**30, 1), props.multi_processor_count)
    return {**peak, "runtime_table_tflops": default_peak_tflops(torch.device("cuda"), None)}


def logged_numbers(r: Run) -> dict[str, Any]:
    """What the run logged: its MLflow metrics, else its log lines (a store a killed run left unreadable)."""
    try:
        h, source = r.history(), "mlflow"
    except Exception as e:  # noqa: BLE001 - whatever the store says, the log lines hold the same windows
        h, source = logged_lines(r.log), f"log lines (MLflow: {type(e).__name__}: {str(e)[:160]})"
    keys = ("tokens_per_s", "mfu", "data_wait_fraction", "steps_per_s", "collate_ms", "train_loss")
    return {"logged_from": source, **{k: _last(h, k) for k in keys},
            "peak_memory_gb": max((v for _, v in h.get("peak_memory_gb", [])), default=None),
            "windows_tokens_per_s": {s: round(v) for s, v in h.get("tokens_per_s", [])}}


def record_numbers(r: Run, s: Sizes, peak: float | None) -> dict[str, Any]:
    """What a run's own files say, finished or stopped at its deadline (cheap: read first, kept first): the steady
    state from its per-step record (windows without a log step, start-up or compile: device_mfu.steady_windows),
    Dynamo's counters where it compiled, its checkpoint and export."""
    steps, info = read_record(r.record) if r.record else ([], {})
    timing = steady_windows(steps, s.log_every, peak)
    tags = sorted(r.dir.glob("checkpoints/step_*/COMPLETE.json"))
    out = {"exit": r.code, "stopped_at_deadline": r.code is None, "wall_s": round(r.wall_s, 1),
           "steps_recorded": len(steps), "steady": timing["steady"], "steady_windows": timing["steady_windows"],
           "steady_reason": timing.get("reason"), "clock": timing["clock"], "timed_windows": timing["windows"],
           "dynamo": info.get("dynamo") or None,
           "checkpoint": tags[-1].parent.name if tags else None, "checkpoint_gib": _gib(r.dir / "checkpoints"),
           "exported": (r.dir / "export" / "encoder.safetensors").is_file()}
    if r.code != 0:
        out["log_tail"] = r.tail(1200)
    return out


def speed_numbers(r: Run, s: Sizes, peak: float | None) -> dict[str, Any]:
    """A run's numbers: its record's, then what it logged (the last logged window holds the previous log step's
    syncs and writes: kept beside the steady state, not instead of it)."""
    return {**record_numbers(r, s, peak), **logged_numbers(r)}


def run_headline(name: str, r: dict[str, Any]) -> str:
    steady = r.get("steady")
    if steady:
        head = (f"{name} {steady['tokens_per_s']:,.0f} tok/s" + (f" MFU {100 * steady['mfu']:.1f}%" if steady["mfu"]
                                                                   else "")
                + f" ({r['clock'].split('_')[0]} clock, {r['steady_windows']} windows ±{100 * steady['spread']:.0f}%)"
                + f" wait {100 * (steady['data_wait_fraction'] or 0):.1f}%")
    elif r.get("tokens_per_s"):
        head = f"{name} {r['tokens_per_s']:,.0f} tok/s as logged ({r.get('steady_reason')})"
    else:
        return f"{name}: no numbers"
    if r.get("dynamo"):
        head += f" {r['dynamo'].get('recompiles', 0)} recompiles"
    return head + f" peak {r.get('peak_memory_gb') or 0:.1f} GB" + (" (stopped)" if r["stopped_at_deadline"] else "")


def pretrain(report: Report, ctx: Context) -> None:
    s = sizes(ctx)
    data = corpus(ctx, s.corpus)
    peak = device_peak()
    extra = {"tracking.peak_tflops": peak["tflops"]} if peak["tflops"] else {}
    report.update(corpus=describe(data), settings=speed_settings(s, 1, **extra), runs={}, peak=peak,
                  counted="tokens/s: real encoder + decoder tokens of every micro-batch over wall time; steady: the "
                          "windows between log steps, each timed from the end of its first step to the end of its "
                          "last (GPU events on CUDA), so no window holds the step log's syncs and sqlite writes; "
                          "not the first window (start-up), none that compiled or crossed an epoch "
                          "(benchmarks/device_mfu.py); as logged: the run's own windows (each holds the previous "
                          "log step's work). MFU: the model's FLOPs (modeling/flops.py) over `peak`; peak memory: "
                          "torch's max allocated (CUDA) or the process's max RSS (CPU)")
    # ZeRO-1 with the defaults; then with the switches that are off until measured faster (torch.compile of the
    # layers; no per-step overflow check, so no host sync left in the step), before ZeRO-2: its cold compile is
    # the slow run, and a run stopped at its deadline keeps what it logged
    order = [("zero1", speed_settings(s, 1, **extra)), ("zero1-compiled", speed_settings(s, 1, **TUNED, **extra)),
             ("zero2", speed_settings(s, 2, **extra))]
    runs: dict[str, Any] = {}
    for i, (name, settings) in enumerate(order):
        # each run until the box less what reading its numbers and the runs after it keep
        deadline = ctx.deadline - READ_S - s.run_reserve_s * (len(order) - 1 - i)
        if deadline - time.time() < s.run_reserve_s / 2:
            runs[name] = {"exit": None, "stopped_at_deadline": True, "skipped": "no time left in the box"}
            continue
        r = pretrain_run(ctx, ctx.work / "runs" / "pretrain", name, data, settings, deadline=deadline, record=True)
        runs[name] = {**record_numbers(r, s, peak["tflops"]),
                      "switches": {k: settings.get(k, not v) for k, v in TUNED.items()}}
        report.update(runs=runs)   # kept before the slower read of its MLflow store
        runs[name].update(logged_numbers(r))
        report.update(runs=runs)
    problems = [f"{n} {r.get('skipped') or 'stopped at its deadline'}" if r["stopped_at_deadline"]
                else f"{n} exited {r['exit']}" for n, r in runs.items() if r["exit"] != 0]
    problems += [f"{n}: no steady state ({r['steady_reason']})" for n, r in runs.items()
                 if r["exit"] == 0 and not r.get("steady")]
    report.finish("failed" if problems else "passed", "; ".join(run_headline(n, r) for n, r in runs.items()),
                  "; ".join(problems) + " (the numbers each run logged are kept)" if problems else None, runs=runs)


# ------------------------------------------------------------------------------------------ step 4
def curve_settings(c: Curve, precision: str) -> dict[str, Any]:
    return {"model": c.model, "model.dropout": 0.0, "deepspeed.zero_stage": 1, "deepspeed.precision": precision,
            "schedule.batch_tokens": c.batch_tokens, "schedule.max_docs_per_batch": c.max_docs,
            "schedule.max_steps": c.steps, "schedule.log_every": 1, "schedule.warmup_steps": c.warmup,
            "optimizer.lr": c.lr, "data.num_workers_loader": 1}


def _digest(obj: Any, h: Any) -> None:
    """Every tensor and array inside `obj` (dataclasses, dicts, sequences), in a fixed order, into `h`."""
    if isinstance(obj, torch.Tensor):
        h.update(str(obj.dtype).encode() + str(tuple(obj.shape)).encode())
        h.update(obj.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        h.update(np.ascontiguousarray(obj).tobytes())
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            _digest(getattr(obj, f.name), h)
    elif isinstance(obj, dict):
        for k in sorted(obj):
            _digest(obj[k], h)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _digest(x, h)
    elif isinstance(obj, (int, float, str, bool)):
        h.update(repr(obj).encode())


def fingerprint(ctx: Context, c: Curve, data: Path) -> dict[str, str]:
    """What must be equal for two curves to be comparable: tokenizer, tokens, the first micro-batch the loader
    makes (masks included) and the initial weights (as the Trainer seeds them)."""
    cfg = load_config(None, pretrain_args(ctx.work / "fingerprint", "f", data, curve_settings(c, "fp32"))[1:])
    ds = DocumentDataset(data, "train")
    shards = sorted((data / "train").glob("shard-*/tokens.npy"))
    task = MaskedSentenceTask(cfg, vocab_size(ds.tokenizer_path))
    s = cfg.schedule
    plan = plan_epoch(doc_costs(ds.doc_num_tokens, ds.doc_num_sentences), seed=s.seed, epoch=0,
                      batch_tokens=s.batch_tokens, max_docs=s.max_docs_per_batch, world=1, accum=1)
    batch, weights = hashlib.sha256(), hashlib.sha256()
    _digest(task.make_item(ds, plan.rank_batches(0, 1, 1)[0], 0).batch, batch)
    torch.manual_seed(cfg.run.seed)
    _digest(task.build_model().state_dict(), weights)
    return {"tokenizer": _sha(ds.tokenizer_path.read_bytes()),
            "train_tokens": _sha((data / "train" / "index.npy").read_bytes(), *(p.read_bytes() for p in shards)),
            "first_batch": batch.hexdigest()[:16], "init_weights": weights.hexdigest()[:16]}


def start_curves(ctx: Context, key: str, data: Path, precisions: tuple[str, ...]) -> dict[str, Any]:
    """Step 4's runs side by side (each its own store: one sqlite writer each), fp32 matmuls pinned
    (FP32_COMPARISON)."""
    started = {}
    for precision in precisions:
        root = ctx.work / "runs" / f"curve-{key}-{precision}"
        settings = curve_settings(CURVES[key], precision)
        started[precision] = (root, time.time(), *start(ctx, root, precision, data, settings, record=True,
                                                        pin_fp32=True))
    return started


def finish_curves(ctx: Context, started: dict[str, Any]) -> dict[str, tuple[list[float], Run, dict[str, Any]]]:
    """Per precision: the train loss it logged (all of it, or what a stopped run had), the run, its precision state."""
    out = {}
    for precision, (root, t0, proc, log, rec) in started.items():
        r = Run(root, precision, finish_run(proc, ctx.deadline - READ_S), time.time() - t0, log, rec)
        try:
            losses = [v for _, v in r.history().get("train_loss", [])]
        except Exception:  # noqa: BLE001 - a run that never reached MLflow: its exit and log say why
            losses = []
        info = read_record(rec)[1]
        out[precision] = (losses, r, info.get("precision_at_first_step") or info.get("precision") or {})
    return out


def loss_curve(report: Report, ctx: Context) -> None:
    key = "dry_run" if ctx.dry_run else "device"
    c = CURVES[key]
    ref = json.loads(REFERENCE.read_text())["curves"].get(key) if REFERENCE.is_file() else None
    data = corpus(ctx, c.corpus)
    started = start_curves(ctx, key, data, ("fp32", "bf16"))
    fp = fingerprint(ctx, c, data)   # while the runs start
    report.update(config=asdict(c), fingerprint=fp, reference=str(REFERENCE.relative_to(REPO)),
                  reference_fingerprint=ref and ref["fingerprint"], fp32_comparison=FP32_COMPARISON,
                  tolerances={"fp32_vs_cpu_reference_rtol_every_step": FP32_CURVE_RTOL,
                              "bf16_vs_fp32_end_rtol": BF16_END_RTOL})
    done = finish_curves(ctx, started)
    (fp32, r32, p32), (bf16, r16, p16) = done["fp32"], done["bf16"]
    report.update(fp32=fp32, bf16=bf16, matmul_precision={"fp32": p32, "bf16": p16})
    problems = [f"{name} run {'stopped at its deadline' if r.code is None else f'exited {r.code}'}: {r.tail(600)}"
                if r.code != 0 else f"{name} logged {len(curve)} of {c.steps} steps"
                for name, curve, r in (("fp32", fp32, r32), ("bf16", bf16, r16))
                if r.code != 0 or len(curve) != c.steps]
    if tf32_possible(p32):
        problems.append(f"the fp32 run's matmuls were not pinned to IEEE fp32: {p32}")
    numbers: dict[str, Any] = {}
    if ref is None:
        problems.append(f"no reference curve for {key} in {REFERENCE.name}: make it with --make-reference")
    elif ref["fingerprint"] != fp:
        diff = [k for k in fp if fp[k] != ref["fingerprint"].get(k)]
        problems.append(f"not comparable: {', '.join(diff)} differ from the reference's (another tokenizer, numpy "
                        "or model code): make the reference again with this tree (--make-reference)")
    elif len(fp32) == len(ref["train_loss"]):
        rel = [abs(a - b) / abs(b) for a, b in zip(fp32, ref["train_loss"])]
        numbers["fp32_vs_reference_max_rel"] = max(rel)
        numbers["fp32_vs_reference_worst_step"] = int(np.argmax(rel)) + 1
        if max(rel) > FP32_CURVE_RTOL:
            problems.append(f"fp32 is {100 * max(rel):.2f}% off the CPU reference at step "
                            f"{numbers['fp32_vs_reference_worst_step']} (tolerance {100 * FP32_CURVE_RTOL}%)")
    if len(fp32) == len(bf16) == c.steps:
        end32, end16 = float(np.mean(fp32[-3:])), float(np.mean(bf16[-3:]))
        numbers.update(fp32_end=end32, bf16_end=end16, bf16_vs_fp32_end_rel=abs(end16 - end32) / end32,
                       falls=fp32[-1] < fp32[0])
        if numbers["bf16_vs_fp32_end_rel"] > BF16_END_RTOL:
            problems.append(f"bf16 ends {100 * numbers['bf16_vs_fp32_end_rel']:.2f}% from fp32 "
                            f"(tolerance {100 * BF16_END_RTOL}%)")
        if not numbers["falls"]:
            problems.append("the fp32 loss does not fall")
    head = ", ".join(f"{k} {100 * numbers[k]:.3f}%" for k in ("fp32_vs_reference_max_rel", "bf16_vs_fp32_end_rel")
                     if k in numbers)
    report.finish("failed" if problems else "passed", head, "; ".join(problems) or None, **numbers)


# ------------------------------------------------------------------------------------------ step 3
def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_numbers(prof: Any, steps: int, wall_s: float) -> dict[str, Any]:
    events = prof.key_averages()
    # a user range (record_function: the optimizer's step, inductor's "## Call CompiledFxGraph ##") also gets a GPU
    # copy spanning its kernels: not a kernel, and counting it counts those kernels twice (torch's own table skips it)
    kernels = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                      and not getattr(e, "is_user_annotation", False)), key=lambda e: -e.self_device_time_total)
    cpu_ops = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
                     key=lambda e: -e.self_cpu_time_total)
    busy = sum(e.self_device_time_total for e in kernels) / 1000 / steps
    out: dict[str, Any] = {
        "steps": steps, "wall_ms_per_step": round(wall_s * 1000 / steps, 2),
        "top_cpu_ops": [{"op": e.key, "self_ms_per_step": round(e.self_cpu_time_total / 1000 / steps, 3),
                         "calls_per_step": e.count / steps} for e in cpu_ops[:10]]}
    if not torch.cuda.is_available():
        return {**out, "kernels": "skipped: no CUDA", "host_syncs_per_step": "skipped: no CUDA"}
    return {**out, "gpu_busy_ms_per_step": round(busy, 2), "kernels_per_step": sum(e.count for e in kernels) / steps,
            # less the one synchronize that closes the trace (profiled(): the last step's kernels end inside it)
            "host_syncs_per_step": max(sum(e.count for e in events if e.key in HOST_SYNCS) - 1, 0) / steps,
            "top_kernels": [{"kernel": e.key[:160], "ms_per_step": round(e.self_device_time_total / 1000 / steps, 3),
                             "share_of_busy": round(e.self_device_time_total / 1000 / steps / busy, 3)
                             if busy else None, "calls_per_step": e.count / steps} for e in kernels[:12]]}


def fastest_zero1(ctx: Context) -> dict[str, Any]:
    """The switches of step 2's fastest ZeRO-1 run ({} = the defaults), from its JSON in the output folder: by its
    steady tokens/s, else (no steady state) as logged."""
    done = ctx.out / next(st.file for st in SUITE_STEPS if st.name == "pretrain")
    runs = json.loads(done.read_text()).get("runs", {}) if done.is_file() else {}
    rate = {n: (r.get("steady") or {}).get("tokens_per_s") or r.get("tokens_per_s") for n, r in runs.items()
            if n.startswith("zero1")}
    timed = {n: v for n, v in rate.items() if v}
    if not timed:
        return {}
    best = max(timed, key=timed.get)
    return {k: v for k, v in runs[best].get("switches", {}).items() if TUNED.get(k) == v}


class _Profiled(Exception):
    """Raised after the profiled steps: the profile needs no evaluation, checkpoint or export."""


def profile(report: Report, ctx: Context) -> None:
    """Step 2's fastest ZeRO-1 configuration (the default one where step 2 has no number) in this process,
    through the same Trainer, its train steps after `profile_warm` ones under torch.profiler (the step log is
    outside them; a compiled run compiles in the warm steps, from step 2's inductor cache); the run stops there."""
    s = sizes(ctx)
    data = corpus(ctx, s.corpus)
    last = s.profile_warm + s.profile_steps
    root = ctx.work / "runs" / "profile"
    store(ctx, root)
    switches = fastest_zero1(ctx)
    args = pretrain_args(root, "zero1", data, speed_settings(s, 1, **switches, **{"schedule.max_steps": last,
                                                                                  "schedule.log_every": last}))
    cfg = load_config(None, args[1:])
    inputs = prepare_run(cfg)
    trainer = Trainer(cfg, MaskedSentenceTask(cfg, inputs.vocab_size), inputs.rt, inputs.train, inputs.valid)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = torch_profile(activities=activities)
    timing: dict[str, float] = {}
    step = trainer.train_step

    def profiled(batches: Any, window: Any) -> dict[str, torch.Tensor]:
        k = trainer.state.global_step
        if k == s.profile_warm:
            _sync()
            prof.start()
            timing["t0"] = time.perf_counter()
        stats = step(batches, window)
        if k + 1 == last:
            _sync()
            timing["wall"] = time.perf_counter() - timing["t0"]
            prof.stop()
            raise _Profiled
        return stats

    trainer.train_step = profiled
    with contextlib.suppress(_Profiled):
        trainer.fit()
    if dist.is_initialized():
        dist.destroy_process_group()
    numbers = profile_numbers(prof, s.profile_steps, timing["wall"])
    numbers.update(settings=speed_settings(s, 1, **switches), dynamo=dynamo_counts() or None)
    if torch.cuda.is_available():
        top = numbers["top_kernels"][0] if numbers["top_kernels"] else {"kernel": "-", "share_of_busy": 0}
        head = (f"{numbers['wall_ms_per_step']:.1f} ms/step, GPU busy {numbers['gpu_busy_ms_per_step']:.1f} ms, "
                f"{numbers['host_syncs_per_step']:.1f} host syncs/step, top {top['kernel'][:50]} "
                f"{100 * (top['share_of_busy'] or 0):.0f}%")
    else:
        # a compiled step's C++ runs inside inductor's range on CPU: name it without the graph's hash
        op = re.sub(r"## Call CompiledFxGraph \w+ ##", "inductor's compiled graph", numbers["top_cpu_ops"][0]["op"])
        head = f"{numbers['wall_ms_per_step']:.1f} ms/step, top op {op}"
    report.finish("passed", head, **numbers)


# ------------------------------------------------------------------------------------------ step 6
def _wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> bool:
    t0 = time.time()
    while not path.is_file():
        if proc.poll() is not None or time.time() - t0 > timeout:
            return False
        time.sleep(0.05)
    return True


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return {k: v.double() for k, v in load_file(str(run_dir / "export" / "encoder.safetensors")).items()}


def _norm(tensors: Iterator[torch.Tensor]) -> float:
    return float(sum(float((t * t).sum()) for t in tensors) ** 0.5)


def resume(report: Report, ctx: Context) -> None:
    """kill -9 of a run right after its first checkpoint, its resume, and the same run uninterrupted."""
    s = sizes(ctx)
    data = corpus(ctx, s.corpus)
    k = s.resume_every
    settings = speed_settings(s, 2, **{"schedule.max_steps": s.resume_steps, "schedule.log_every": 2,
                                       "checkpoint.every_steps": k, "checkpoint.keep_last": 3,
                                       "checkpoint.resume": "auto", "optimizer.lr": 5e-4, "schedule.warmup_steps": 2})
    root = ctx.work / "runs" / "resume"
    ref = pretrain_run(ctx, root / "uninterrupted", "run", data, settings)
    report.update(settings=settings, uninterrupted={"exit": ref.code, "wall_s": round(ref.wall_s, 1)})
    proc, _, _ = start(ctx, root / "killed", "run", data, settings, "-first")
    try:
        caught = _wait_for(root / "killed" / "run" / "checkpoints" / f"step_{k:09d}" / "COMPLETE.json", proc,
                           ctx.left())
    finally:
        proc.kill()   # kill -9
        proc.wait()
    later = [p for p in (root / "killed" / "run" / "checkpoints").glob("step_*") if int(p.name.split("_")[1]) > k]
    for p in later:   # as if killed right after step k's save
        shutil.rmtree(p)
    killed_before_end = caught and not (root / "killed" / "run" / "export").exists()
    again = pretrain_run(ctx, root / "killed", "run", data, settings, "-resumed")
    resumed = re.search(r"resumed from \S+ at step (\d+) ", again.log.read_text(errors="replace"))
    numbers: dict[str, Any] = {"killed_after_checkpoint": k, "killed_before_end": killed_before_end,
                               "later_tags_removed": len(later), "resume_exit": again.code,
                               "resumed_at": int(resumed.group(1)) if resumed else None}
    report.update(**numbers)
    if ref.code != 0 or again.code != 0:
        bad = ref if ref.code != 0 else again
        ended = "was stopped at its deadline" if bad.code is None else f"exited {bad.code}"
        report.finish("failed", "", f"a run {ended}: {bad.tail(800)}", **numbers)
        return
    want, got = ref.history()["train_loss"], again.history()["train_loss"]
    a, b = _weights(ref.dir), _weights(again.dir)
    cfg = load_config(None, pretrain_args(root / "init", "i", data, settings)[1:])
    torch.manual_seed(cfg.run.seed)   # the Trainer's initial weights: how far training moved them
    init = MaskedSentenceTask(cfg, vocab_size(data / "tokenizer.model")).build_model().encoder.state_dict()
    diff = _norm(a[n] - b[n] for n in a)
    numbers.update(logged_steps_uninterrupted=[i for i, _ in want], logged_steps_resumed=[i for i, _ in got],
                   loss_bit_identical=want == got, weights_bit_identical=all(torch.equal(a[n], b[n]) for n in a),
                   weights_max_abs_diff=max(float((a[n] - b[n]).abs().max()) for n in a),
                   weights_drift=diff / max(_norm(a[n] - init[n].double() for n in a if n in init), 1e-30),
                   loss_max_rel_diff=max((abs(x - y) / abs(y) for (_, x), (_, y) in zip(got, want)), default=None))
    problems = []
    if not killed_before_end:
        problems.append(f"the run was not killed between its step-{k} checkpoint and its end")
    if numbers["resumed_at"] != k:
        problems.append(f"resumed at {numbers['resumed_at']}, not at the step-{k} checkpoint")
    if numbers["logged_steps_resumed"] != numbers["logged_steps_uninterrupted"]:
        problems.append("the logged steps differ (each step must be logged once)")
    if ctx.dry_run or not torch.cuda.is_available():
        compared = "exactly (CPU: bit-identical weights and logged losses)"
        if not (numbers["weights_bit_identical"] and numbers["loss_bit_identical"]):
            problems.append("not bit-identical on CPU")
    else:
        compared = (f"bit-identical: {numbers['weights_bit_identical']}; else within {100 * RESUME_LOSS_RTOL}% of the "
                    f"loss at every logged step and {RESUME_DRIFT_MAX} of the weights' travel (CUDA atomics)")
        if not numbers["weights_bit_identical"] and (numbers["loss_max_rel_diff"] > RESUME_LOSS_RTOL
                                                      or numbers["weights_drift"] > RESUME_DRIFT_MAX):
            problems.append(f"loss {100 * numbers['loss_max_rel_diff']:.2f}% / weights drift "
                            f"{numbers['weights_drift']:.3f} from the uninterrupted run")
    head = (f"resumed at step {numbers['resumed_at']}: "
            + ("bit-identical" if numbers["weights_bit_identical"] and numbers["loss_bit_identical"] else
               f"loss within {100 * numbers['loss_max_rel_diff']:.3f}%, weights drift {numbers['weights_drift']:.2e}"))
    report.finish("failed" if problems else "passed", head, "; ".join(problems) or None, compared=compared, **numbers)


# ------------------------------------------------------------------------------------------ step 7
@contextlib.contextmanager
def child_pythonpath() -> Iterator[None]:
    """bench_mds.py measures memory in children started with a bare environment (PATH, OMP_NUM_THREADS): packages
    carried on PYTHONPATH (--wheels, the hibert link tree) must reach them too."""
    path, run = os.environ.get("PYTHONPATH"), subprocess.run

    def with_path(*args: Any, **kw: Any) -> subprocess.CompletedProcess:
        if path and kw.get("env") is not None:
            kw["env"] = {**kw["env"], "PYTHONPATH": path}
        return run(*args, **kw)

    subprocess.run = with_path
    try:
        yield
    finally:
        subprocess.run = run


def mds(report: Report, ctx: Context) -> None:
    """bench_mds.py on the GPU (bf16, H=512, 8 clusters per step, 800 to 6,000 source tokens: time and peak
    allocated memory per training step of the hierarchical and the flat encoders); on CPU in the dry run."""
    result = ctx.work / "bench_mds.json"
    argv, sys.argv = sys.argv, [str(HERE / "bench_mds.py"), *sizes(ctx).mds_args, "--out", str(result)]
    try:
        with child_pythonpath():
            runpy.run_path(str(HERE / "bench_mds.py"), run_name="__main__")
    except SystemExit as e:
        if e.code:
            raise RuntimeError(f"bench_mds.py exited {e.code}") from None
    finally:
        sys.argv = argv
    res = json.loads(result.read_text())
    growth = res["growth_exponent"]
    report.finish("passed", " / ".join(f"{k} n^{v['time']:.2f}" for k, v in growth.items())
                  + f"; ranker {res['ranker_clusters_per_s']:.0f} clusters/s",
                  settings=res["settings"], rows=res["rows"], growth_exponent=growth,
                  ranker_clusters_per_s=res["ranker_clusters_per_s"])


STEPS: dict[str, Callable[[Report, Context], None]] = {
    "cuda_tests": cuda_tests, "pretrain": pretrain, "loss_curve": loss_curve, "profile": profile,
    "resume": resume, "mds": mds}


# ------------------------------------------------------------------------------------------ the reference
def make_reference(ctx: Context) -> int:
    """Step 4's CPU curves (fp32, both configurations), with the fingerprints that make them comparable."""
    curves = {}
    for key, c in CURVES.items():
        data = corpus(ctx, c.corpus)
        t0 = time.time()
        losses, r, _ = finish_curves(ctx, start_curves(ctx, key, data, ("fp32",)))["fp32"]
        if r.code != 0 or len(losses) != c.steps:
            print(f"{key}: the fp32 run failed (exit {r.code}):\n{r.tail()}", file=sys.stderr)
            return 1
        curves[key] = {"config": asdict(c), "fingerprint": fingerprint(ctx, c, data), "train_loss": losses,
                       "seconds": round(time.time() - t0, 1)}
        print(f"{key}: {c.model} fp32 {c.steps} steps {losses[0]:.4f} -> {losses[-1]:.4f} in {time.time() - t0:.0f} s",
              flush=True)
    return write_results(REFERENCE, {
        "machine": machine_block(ctx), "made_by": "bash benchmarks/device_suite.sh --make-reference",
        "note": "fp32 train_loss per step on CPU, dropout off; device_steps.loss_curve compares the GPU's fp32 curve "
                "of the same configuration to it (config 'device'; the dry run uses 'dry_run')",
        "curves": curves})
