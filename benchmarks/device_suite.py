"""The GPU checks a lent device machine runs, in one command (`bash benchmarks/device_suite.sh`), and their CPU
dry run (`--dry-run`: the same steps, tiny sizes, gloo, DS_ACCELERATOR=cpu, CUDA hidden).

Steps, in order of value, each in its own process with its own time box (a failing or slow step never costs the
ones after it), each writing one small JSON to the output directory (`$OUT` where the device tool sets it, else
`--out`, else runs/device-suite): 1_environment, 2_pretrain, 3_profile, 4_loss_curve, 5_cuda_tests, 6_resume,
7_mds, and at the end summary.json and one printed table. A step's JSON: its status (passed, failed, timed_out,
skipped, with the reason), seconds, time box, its numbers and the machine (GPU, torch, CUDA, DeepSpeed, commit,
whether tracked files had changes). The budget (420 s on the device) holds the wheels' installation and every
step's box. Step 1 is here; steps 2-7 and `--make-reference` are in device_steps.py.

This module imports only the standard library at its top: it runs on a bare machine before the wheels carried in
the working tree (`--wheels DIR`) are installed, and before `hibert` is importable (it makes it so: an installed
copy of this tree, or a link tree in the work directory that lays the folders out as the installed package).
The steps import torch and the project; step 1 imports torch and DeepSpeed inside its function because importing
them is what it checks.

    bash benchmarks/device_suite.sh                    # on the GPU machine (with --wheels .whl when carried)
    bash benchmarks/device_suite.sh --dry-run --out /tmp/ds
    bash benchmarks/device_suite.sh --make-reference   # CPU: benchmarks/results/device_suite_reference_cpu.json
    bash benchmarks/device_suite.sh --stamp            # before a device call: the commit, for a copy without .git
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "benchmarks"
STAMP = REPO / "runs" / "device-suite-source.json"  # ignored; carried to the device (`--stamp`)


@dataclass(frozen=True)
class Step:
    name: str
    box_s: int          # time box on the device
    dry_box_s: int      # time box in the dry run (2 CPU cores)
    min_s: int          # not started with less of the budget left

    @property
    def file(self) -> str:
        return f"{STEPS.index(self) + 1}_{self.name}.json"


# In order of value: what the first GPU window must bring back first (the environment, the end-to-end pretraining
# MFU and its profile), the CUDA tests (cold compiles against a per-test timeout) after the numbers. Every step is
# guaranteed its box: the wheels' installation (SETUP_BOX_S) and the boxes add up to no more than the budget (one
# 420 s device call, set-up included), and what a step leaves unused goes to the next one (`box_now`).
STEPS = [
    Step("environment", 25, 25, 15),
    Step("pretrain", 170, 100, 60),
    Step("profile", 40, 25, 20),
    Step("loss_curve", 45, 40, 30),
    Step("cuda_tests", 40, 15, 15),
    Step("resume", 40, 45, 30),
    Step("mds", 30, 30, 20),
]
SETUP_BOX_S, DRY_SETUP_BOX_S = 30, 20   # pip, then unpacking where pip fails (install_wheels)
DEVICE_BUDGET_S, DRY_BUDGET_S = 420, 300
# a step past its box: SIGTERM (its `finally` stops its runs), SIGKILL of its process group GRACE_S later; the step
# is stopped STOP_S before its box ends, so that stopping it fits in the box too
GRACE_S, STOP_S = 3, 6

# Python modules the steps import (the image's own torch and numpy included); what is missing must be carried.
REQUIRED = ("torch", "numpy", "deepspeed", "mlflow", "pydantic", "yaml", "sentencepiece", "safetensors",
            "filelock", "tqdm", "pytest")
# Where the source of a result lives (its digest ties a device result to a stamp made where git is).
SOURCE_DIRS = ("hibert", "modeling", "data_prep", "pretrain", "finetune", "slurm", "configs", "benchmarks", "tests")
SOURCE_SUFFIXES = (".py", ".yaml", ".toml", ".sh", ".sbatch")


# ------------------------------------------------------------------------------------------- a step's record
class Report:
    """A step's JSON, rewritten whenever it learns something: a step killed at its time box keeps what it had."""

    def __init__(self, path: Path, step: str, machine: dict[str, Any]):
        self.path = path
        self.data: dict[str, Any] = {"step": step, "status": "running", "reason": None, "headline": "",
                                     "machine": machine}
        self.write()

    def update(self, **numbers: Any) -> None:
        self.data.update(numbers)
        self.write()

    def finish(self, status: str, headline: str = "", reason: str | None = None, **numbers: Any) -> None:
        self.update(status=status, headline=headline, reason=reason, **numbers)

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


@dataclass
class Context:
    """What a step gets: where to write, where to work, whether this is the CPU dry run, and its deadline."""
    out: Path
    work: Path
    dry_run: bool
    deadline: float
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def left(self) -> float:
        return max(1.0, self.deadline - time.time())


# ------------------------------------------------------------------------------------------ provenance
def tree_digest(root: Path = REPO) -> str:
    """sha256 of the source files as they are (paths and bytes): a copy without .git (the device's) is matched to
    the stamp made where git is."""
    h = hashlib.sha256()
    files = [root / "pyproject.toml"] + sorted(p for d in SOURCE_DIRS if (root / d).is_dir()
                                               for p in (root / d).rglob("*") if p.suffix in SOURCE_SUFFIXES
                                               and p.is_file() and "__pycache__" not in p.parts
                                               and "results" not in p.relative_to(root).parts)
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_revision() -> dict[str, Any]:
    """The commit and whether tracked files had changes (workload.py's, which every result uses); empty without git."""
    sys.path.insert(0, str(HERE))
    from workload import source_revision  # brings torch: not in the orchestrator (module docstring)

    return source_revision()


def revision() -> dict[str, Any]:
    """git's answer where there is one, else the stamp's when its digest is this tree's."""
    digest = tree_digest()
    rev = git_revision()
    if rev:
        return {**rev, "tree_digest": digest}
    if STAMP.is_file():
        stamp = json.loads(STAMP.read_text())
        if stamp.get("tree_digest") == digest:
            return {"commit": stamp["commit"], "tracked_changes": stamp["tracked_changes"], "tree_digest": digest,
                    "commit_from": f"stamp {stamp.get('stamped')}"}
        return {"tree_digest": digest, "commit_from": f"none: the stamp {STAMP.name} is of another tree "
                                                      f"({stamp.get('tree_digest')}); run --stamp before the call"}
    return {"tree_digest": digest, "commit_from": "none: no git here and no stamp (bash benchmarks/device_suite.sh "
                                                  "--stamp where git is, and carry runs/device-suite-source.json)"}


def write_stamp() -> Path:
    rev = git_revision()
    if not rev:
        raise SystemExit("--stamp needs git and the repository's .git")
    STAMP.parent.mkdir(parents=True, exist_ok=True)
    STAMP.write_text(json.dumps({**rev, "tree_digest": tree_digest(), "stamped": time.strftime("%Y-%m-%dT%H:%M:%S")},
                                indent=1))
    return STAMP


def machine_block(ctx: Context) -> dict[str, Any]:
    """benchmarks/workload.py's machine description (every result carries it), with DeepSpeed's version, the GPU's
    memory, how `hibert` was imported, and the commit (git's, or the stamp's on a copy without .git)."""
    sys.path.insert(0, str(HERE))
    import torch
    from workload import machine  # torch: not before this process's environment was set up (module docstring)

    info = {k: v for k, v in machine().items() if k not in ("commit", "tracked_changes")}
    info.update(revision())
    info["deepspeed"] = _version("deepspeed")
    info["dry_run"] = ctx.dry_run
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu_memory_gib=round(props.total_memory / 2**30, 1), gpu_count=torch.cuda.device_count())
    spec = importlib.util.find_spec("hibert")
    info["hibert_from"] = str(Path(spec.origin).parent) if spec and spec.origin else None
    return info


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------------------ the step environment
def install_wheels(wheels: Path, site: Path, timeout: float, python: str = sys.executable) -> dict[str, Any]:
    """The carried wheels into a private target (the image's own packages, torch's CUDA build first among them,
    stay as they are). --no-deps: the bundle is complete by construction (benchmarks/offline_bundle.sh). Where pip
    is missing, fails or takes longer than `timeout`, the wheels are unpacked there instead (`unpack_wheels`).
    Never raises: what happened is the record step 1 reports, and the steps go on with what then imports."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    rec: dict[str, Any] = {"dir": str(wheels), "count": len(found), "installer": None}
    if not found:
        rec["error"] = f"--wheels {wheels}: no .whl files there"
        return rec
    site.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--disable-pip-version-check", "--upgrade", "--target", str(site), *map(str, found)]
    t0 = time.time()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        failed = f"pip exited {out.returncode}: {out.stderr.strip()[-1200:]}" if out.returncode else None
    except subprocess.TimeoutExpired:
        failed = f"pip did not finish in {timeout:.0f} s"
    except OSError as e:
        failed = f"pip did not start: {e}"
    if failed is None:
        rec.update(installer="pip", seconds=round(time.time() - t0, 1))
    else:
        rec["pip_failed"] = failed
        try:
            rec.update(installer="unpacked", files=unpack_wheels(found, site), seconds=round(time.time() - t0, 1))
        except (OSError, zipfile.BadZipFile) as e:
            rec["error"] = f"unpacking the wheels failed too: {type(e).__name__}: {e}"
    print(f"wheels from {wheels} into {site}: {rec['installer'] or 'not installed'}"
          f"{' (pip: ' + failed.splitlines()[0][:200] + ')' if failed else ''}", flush=True)
    return rec


def unpack_wheels(found: list[Path], site: Path) -> int:
    """A wheel is a zip of its files laid out as installed (PEP 427): each extracted into `site`, its
    `<name>.data/purelib` and `platlib` at the top (its scripts, headers and data files are not imported). On
    PYTHONPATH this is what `pip install --target` gives. Returns how many files."""
    count = 0
    for whl in found:
        with zipfile.ZipFile(whl) as z:
            for info in z.infolist():
                parts = PurePosixPath(info.filename).parts
                if parts and parts[0].endswith(".data"):
                    parts = parts[2:] if len(parts) > 2 and parts[1] in ("purelib", "platlib") else ()
                if info.is_dir() or not parts or ".." in parts or info.filename.startswith("/"):
                    continue
                target = site.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                mode = info.external_attr >> 16
                if mode & 0o111:   # executables the package runs (e.g. a bundled binary)
                    os.chmod(target, mode & 0o777)
                count += 1
    return count


def package_links(target: Path) -> Path:
    """`hibert` importable from this tree without installing it: target/hibert holds links to hibert/'s files and,
    as its subpackages, to the top-level folders pyproject's package-dir maps (modeling -> hibert.modeling, ...)."""
    pkg = target / "hibert"
    if pkg.exists():
        shutil.rmtree(pkg)
    pkg.mkdir(parents=True)
    for entry in (REPO / "hibert").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in dirs.items():
        parts = name.split(".")
        if len(parts) == 2 and folder != "hibert":   # hibert.modeling = "modeling": one link covers its subpackages
            (pkg / parts[1]).symlink_to(REPO / folder)
    return target


def import_origin(env: dict[str, str], module: str = "hibert") -> str | None:
    """The file a fresh interpreter with `env` imports `module` from (None: it cannot)."""
    code = "import importlib, sys; print(importlib.import_module(sys.argv[1]).__file__)"
    out = subprocess.run([sys.executable, "-c", code, module], env=env, capture_output=True, text=True, cwd="/")
    return out.stdout.strip() if out.returncode == 0 else None


def step_env(args: argparse.Namespace, work: Path, setup_box: float) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment every step inherits, and what setting it up found (recorded by step 1)."""
    t0 = time.time()
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)   # every run names its own store
    env.update(PYTHONUNBUFFERED="1", MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
    if args.dry_run:
        env.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")   # CPU even where a GPU is
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    setup: dict[str, Any] = {"wheels": None}
    if args.wheels:
        site = work / "site"
        setup["wheels"] = install_wheels(Path(args.wheels), site, setup_box)
        if setup["wheels"]["installer"]:
            paths.insert(0, str(site))
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    installed = import_origin(env)
    setup["hibert_installed"] = installed
    # the link tree is built and imported every time (the dry run proves the path a bare device takes), and used
    # where hibert is not installed from this tree (PYTHONPATH comes before site-packages and editable finders)
    links = str(package_links(work / "package"))
    linked = {**env, "PYTHONPATH": os.pathsep.join([links, *paths])}
    setup["link_tree"] = import_origin(linked, "hibert.pretrain.cli")
    if installed is None or not os.path.realpath(installed).startswith(str(REPO) + os.sep):
        env = linked
    setup["hibert_from"] = import_origin(env)
    probe = ("import importlib.util as u, json, sys; "
             "print(json.dumps([m for m in sys.argv[1:] if u.find_spec(m) is None]))")
    out = subprocess.run([sys.executable, "-c", probe, *REQUIRED], env=env, capture_output=True, text=True)
    setup["missing"] = json.loads(out.stdout) if out.returncode == 0 else list(REQUIRED)
    setup["seconds"] = round(time.time() - t0, 1)
    return env, setup


# ------------------------------------------------------------------------------------------ step 1: environment
FUSED_ADAM_PROBE = r"""
import json, time, torch
if not torch.cuda.is_available():
    print(json.dumps({"status": "skipped", "reason": "no CUDA"}))
    raise SystemExit
t = time.time()
from deepspeed.ops.adam import FusedAdam   # JIT-builds multi_tensor_adam on first use unless prebuilt
p = torch.nn.Parameter(torch.zeros(4096, device="cuda"))
p.grad = torch.ones_like(p)
opt = FusedAdam([p], lr=1e-3)
opt.step()
torch.cuda.synchronize()
print(json.dumps({"status": "loaded", "seconds": round(time.time() - t, 1), "update": float(p.detach().abs().max())}))
"""


# A tiny function through torch.compile's default backend (inductor): on CUDA it generates a Triton kernel, which
# needs triton, a C compiler and Python's headers (Triton builds its launcher) — what step 2's compiled run needs
# before its first step. Time-boxed (COMPILE_PROBE_S to compile, after torch's import); a cold CPU (C++) compile
# takes longer than that, so on CPU it is skipped and step 2's compiled run is the check.
COMPILE_PROBE = r"""
import json, time
t = time.time()
import torch
imported = time.time() - t
f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2.0 + 1.0)
x = torch.randn(4096, device="cuda")
t = time.time()
y = f(x)
torch.cuda.synchronize()
ok = bool(torch.allclose(y, torch.nn.functional.gelu(x) * 2.0 + 1.0, atol=1e-5))
print(json.dumps({"status": "compiled", "import_s": round(imported, 1), "compile_s": round(time.time() - t, 1),
                  "matches_eager": ok}))
"""
COMPILE_PROBE_S, IMPORT_ALLOWANCE_S = 5, 8


class Probe:
    """A check in a child process with its own timeout (a JIT build or a compile that hangs must not take the step
    with it). Started at once; `result` waits for it. The child stays in the step's process group, so that the
    step's end stops what it started (inductor's compile workers) even where the step itself is stopped first."""

    def __init__(self, code: str, env: dict[str, str], timeout: float):
        self.t0, self.timeout = time.time(), max(timeout, 1.0)
        self.proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def result(self) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(timeout=max(self.t0 + self.timeout - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return {"status": "timed_out", "seconds": round(time.time() - self.t0, 1),
                    "reason": f"stopped at its {self.timeout:.0f} s box"}
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if self.proc.returncode == 0 and lines:
            return json.loads(lines[-1])
        return {"status": "failed", "seconds": round(time.time() - self.t0, 1), "error": (err or out)[-600:]}


def toolchain() -> dict[str, Any]:
    """What torch.compile needs beside torch: triton (the CUDA backend's kernels), a C compiler and Python's headers
    (Triton compiles its launcher with them; inductor's CPU backend compiles C++)."""
    include = sysconfig.get_paths().get("include") or ""
    cc = os.environ.get("CC")
    return {"triton": _version("triton") or _version("pytorch-triton") or "missing",
            "c_compiler": shutil.which(cc) if cc else next(filter(None, map(shutil.which, ("cc", "gcc", "clang"))),
                                                           None),
            "cxx_compiler": next(filter(None, map(shutil.which, ("c++", "g++", "clang++"))), None),
            "python_headers": str(Path(include) / "Python.h") if (Path(include) / "Python.h").is_file() else None,
            "nvcc": shutil.which("nvcc"), "ninja": shutil.which("ninja")}


def _collective(backend: str, device: str) -> dict[str, Any]:
    """One-rank process group and an all-reduce: the backend loads and runs."""
    import socket

    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.time()
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        x = torch.ones(1024, device=device)
        dist.all_reduce(x)
        ok = bool(x.sum().item() == 1024)
        dist.destroy_process_group()
        return {"backend": backend, "all_reduce": "ok" if ok else "wrong result", "seconds": round(time.time() - t0, 2)}
    except Exception as e:  # any backend error is the finding
        return {"backend": backend, "all_reduce": f"failed: {type(e).__name__}: {str(e)[:300]}"}


def environment(report: Report, ctx: Context) -> None:
    setup = json.loads((ctx.work / "setup.json").read_text())
    import torch  # the check (module docstring)

    cuda = torch.cuda.is_available()
    # the compile probe runs beside the other checks: it costs the step no time of its own
    probe = Probe(COMPILE_PROBE, ctx.env, COMPILE_PROBE_S + IMPORT_ALLOWANCE_S) if cuda else None
    info: dict[str, Any] = {"setup": setup, "cuda_available": cuda, "cuda": torch.version.cuda,
                            "cudnn": torch.backends.cudnn.version() if cuda else None, "toolchain": toolchain()}
    try:
        status, head, reason = check_environment(report, ctx, info)
    finally:
        info["compile_probe"] = (probe.result() if probe else
                                 {"status": "skipped", "reason": "no CUDA: a cold CPU (C++) compile takes longer than "
                                  f"the probe's {COMPILE_PROBE_S} s; the pretrain step's compiled run compiles on CPU"})
    probe_result = info["compile_probe"]
    if probe_result["status"] == "compiled" and probe_result["compile_s"] > COMPILE_PROBE_S:
        probe_result["status"] = f"slow: over its {COMPILE_PROBE_S} s"
    if probe:
        head += f", compile probe {probe_result['status']}"
    wheels = setup.get("wheels") or {}
    if wheels.get("pip_failed") or wheels.get("error"):   # a finding, not a stop: the steps went on
        head += f"; wheels {wheels.get('installer') or 'not installed'} ({wheels.get('error') or 'pip failed'})"
    report.finish(status, head, reason, **info)


def check_environment(report: Report, ctx: Context, info: dict[str, Any]) -> tuple[str, str, str | None]:
    """Step 1's checks into `info` (written as they come); returns status, headline, reason."""
    import torch

    setup, cuda = info["setup"], info["cuda_available"]
    info["packages"] = {m: _version({"yaml": "pyyaml"}.get(m, m)) for m in REQUIRED}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                       "capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count,
                       "count": torch.cuda.device_count(), "bf16": torch.cuda.is_bf16_supported()}
        sys.path.insert(0, str(HERE))
        from device_mfu import peak_tflops   # standard library only

        info["peak"] = peak_tflops(props.name, info["gpu"]["memory_gib"], props.multi_processor_count)
    else:
        info["gpu"] = "skipped: no CUDA"
    info["nccl"] = {"available": torch.distributed.is_nccl_available(),
                    "version": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None}
    # the backend the runtime uses here: NCCL on CUDA, gloo on CPU (hibert/runtime/engine.py)
    info["collective"] = _collective("nccl", "cuda") if cuda else _collective("gloo", "cpu")
    report.update(**info)
    if setup["missing"]:
        return ("failed", f"missing: {', '.join(setup['missing'])}", f"packages missing: {', '.join(setup['missing'])}"
                ": carry them as wheels (--wheels DIR, benchmarks/README.md)")
    if not setup["link_tree"] or not setup["hibert_from"]:
        return ("failed", "hibert not importable", "hibert does not import from this tree (installed: "
                f"{setup['hibert_installed']}; through the link tree: {setup['link_tree']})")
    import deepspeed  # after DS_ACCELERATOR (dry run: cpu): it picks its accelerator on import
    from deepspeed.accelerator import get_accelerator

    ops = getattr(deepspeed.ops, "__compatible_ops__", {})
    installed = getattr(getattr(deepspeed, "git_version_info", None), "installed_ops", {})
    info["deepspeed"] = {"version": deepspeed.__version__, "accelerator": get_accelerator().device_name(),
                         "fused_adam": {"compatible": ops.get("fused_adam"), "prebuilt": installed.get("fused_adam")},
                         "cpu_adam": {"compatible": ops.get("cpu_adam"), "prebuilt": installed.get("cpu_adam")}}
    # DeepSpeed's FusedAdam is loaded where it is prebuilt; a JIT build (nvcc, ~1 min) is not worth the device's
    # minutes, as the runtime never steps with it (below)
    fused = (Probe(FUSED_ADAM_PROBE, ctx.env, min(15.0, ctx.left() - 5)).result() if installed.get("fused_adam")
             else {"status": "not prebuilt", "reason": "not JIT-built here: the runtime does not use it"})
    info["deepspeed"]["fused_adam"]["load"] = fused
    # What the runtime steps with (hibert/runtime/engine.py): torch's AdamW, fused on CUDA; DeepSpeed's FusedAdam
    # is never built by it, DeepSpeedCPUAdam only with deepspeed.offload_optimizer=cpu. Its fused kernel is checked.
    if cuda:
        p = torch.nn.Parameter(torch.zeros(4096, device="cuda"))
        p.grad = torch.ones_like(p)
        torch.optim.AdamW([p], lr=1e-3, fused=True).step()
        torch.cuda.synchronize()
        info["runtime_optimizer"] = {"used": "torch.optim.AdamW(fused=True)", "step": "ok",
                                     "fused_adam_fallback": "not needed: the runtime does not use DeepSpeed's FusedAdam"
                                     if fused.get("status") == "loaded" else
                                     f"DeepSpeed FusedAdam {fused.get('status')}; the runtime's torch fused AdamW ran"}
    else:
        info["runtime_optimizer"] = {"used": "torch.optim.AdamW(fused=False) on CPU", "fused": "skipped: no CUDA"}
    report.update(**info)
    if not ctx.dry_run and not cuda:
        return "failed", "no CUDA", "no CUDA device: on a machine without a GPU run --dry-run"
    ds = f"DeepSpeed {deepspeed.__version__}, FusedAdam {fused.get('status')}"
    tools = info["toolchain"]
    if cuda:
        peak = info["peak"]
        return "passed", (f"{info['gpu']['name']} {info['gpu']['memory_gib']} GiB (peak {peak['tflops']} TFLOP/s as "
                          f"{peak['gpu']}), torch {torch.__version__}, CUDA {torch.version.cuda}, {ds}, NCCL "
                          f"{info['nccl']['version']}, triton {tools['triton']}"), None
    return "passed", (f"CPU, torch {torch.__version__}, {ds}, gloo {info['collective']['all_reduce']}, "
                      f"triton {tools['triton']}, cc {'yes' if tools['c_compiler'] else 'missing'}"), None


# ------------------------------------------------------------------------------------------ running the steps
def run_step(step: Step, ctx: Context, box: float) -> dict[str, Any]:
    """The step in its own process group, stopped at its time box; its JSON completed here whatever happened."""
    path = ctx.out / step.file
    log = ctx.work / "logs" / f"{step.name}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--step", step.name, "--out", str(ctx.out),
           "--work", str(ctx.work), "--deadline", str(ctx.deadline)] + (["--dry-run"] if ctx.dry_run else [])
    t0 = time.time()
    status = None
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=ctx.env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=max(ctx.deadline - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            status = "timed_out"
            _stop(proc)
            code = proc.returncode
    seconds = time.time() - t0
    _stop(proc)  # what the step left behind in its group (loader workers, a killed run's children)
    data = json.loads(path.read_text()) if path.is_file() else {"step": step.name, "headline": "", "reason": None}
    tail = log.read_text(errors="replace")[-2500:]
    if status == "timed_out":
        data.update(status="timed_out", reason=f"stopped at its time box of {box:.0f} s", log_tail=tail)
    elif data.get("status") in (None, "running"):
        data.update(status="failed", reason=f"the step's process ended (exit {code}) before it finished",
                    log_tail=tail)
    elif data["status"] == "failed":
        data["log_tail"] = tail
    data.update(seconds=round(seconds, 1), time_box_s=round(box))
    data.setdefault("machine", {"note": "the step ended before it described the machine"})
    path.write_text(json.dumps(data, indent=1, default=str))
    return data


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the step's process group, SIGKILL after GRACE_S (loader workers ignore SIGTERM)."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, STOP_S - GRACE_S - 0.5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        if sig == signal.SIGTERM:
            time.sleep(0.2)


def headline_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'step':<12} {'status':<10} {'seconds':>7}  headline", "-" * 100]
    for r in rows:
        head = r.get("headline") or r.get("reason") or ""
        if r["status"] not in ("passed",) and r.get("reason") and r.get("headline"):
            head = f"{r['headline']} ({r['reason']})"
        lines.append(f"{r['step']:<12} {r['status']:<10} {r.get('seconds', 0):>7.1f}  {head[:160]}")
    return "\n".join(lines)


def step_box(step: Step, dry_run: bool) -> int:
    return step.dry_box_s if dry_run else step.box_s


def box_now(step: Step, planned: list[Step], left: float, dry_run: bool) -> float:
    """The step's time box: what the budget has left less the boxes of the planned steps after it, so that each
    gets at least its own box and a step that ended early leaves its time to the next one."""
    later = planned[planned.index(step) + 1:]
    return left - sum(step_box(s, dry_run) for s in later)


def orchestrate(args: argparse.Namespace) -> int:
    t_start = time.time()
    out = Path(os.environ.get("OUT") or args.out or REPO / "runs" / "device-suite").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="hibert-device-suite-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    for name in [s.file for s in STEPS] + ["summary.json"]:   # this suite's files only; the rest of OUT stays
        (out / name).unlink(missing_ok=True)
    budget = args.budget or (DRY_BUDGET_S if args.dry_run else DEVICE_BUDGET_S)
    only = set(args.only.split(",")) if args.only else None
    unknown = (only or set()) - {s.name for s in STEPS}
    if unknown:
        raise SystemExit(f"--only: unknown steps {sorted(unknown)}; steps: {[s.name for s in STEPS]}")
    print(f"device suite{' (dry run, CPU)' if args.dry_run else ''}: budget {budget} s, output {out}, work {work}",
          flush=True)
    env, setup = step_env(args, work, DRY_SETUP_BOX_S if args.dry_run else SETUP_BOX_S)
    (work / "setup.json").write_text(json.dumps(setup))
    planned = [s for s in STEPS if only is None or s.name in only]
    rows: list[dict[str, Any]] = []
    machine = None   # a step skipped here carries the machine an earlier step described
    for step in STEPS:
        left = budget - (time.time() - t_start)
        box = box_now(step, planned, left, args.dry_run) if step in planned else 0
        reason = ("not in --only" if step not in planned else
                  f"out of time: {left:.0f} s of the {budget} s budget left, {box:.0f} s after the later steps' "
                  f"boxes; the step needs {step.min_s}" if box < step.min_s else None)
        if reason:
            row = {"step": step.name, "status": "skipped", "reason": reason, "headline": "", "seconds": 0.0,
                   "machine": machine}
            (out / step.file).write_text(json.dumps(row, indent=1, default=str))
        else:
            print(f"[{time.time() - t_start:6.0f} s] {step.name} (time box {box:.0f} s)", flush=True)
            row = run_step(step, Context(out, work, args.dry_run, time.time() + box - STOP_S, env), box)
            machine = row["machine"] if "platform" in row["machine"] else machine
        rows.append({k: row.get(k) for k in ("step", "status", "reason", "headline", "seconds")})
        print(f"[{time.time() - t_start:6.0f} s] {step.name}: {row['status']} {row.get('headline') or ''}"
              f"{' - ' + row['reason'] if row.get('reason') else ''}", flush=True)
    total = time.time() - t_start
    bad = [r["step"] for r in rows if r["status"] in ("failed", "timed_out")]
    summary = {"dry_run": args.dry_run, "budget_s": budget, "total_s": round(total, 1), "output": str(out),
               "setup": setup_summary(setup), "steps": [{**r, "file": s.file} for r, s in zip(rows, STEPS)],
               "ok": not bad, "machine": machine, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    for tmp in out.glob("*.tmp"):   # a step killed while rewriting its JSON: OUT holds at most 8 files
        tmp.unlink(missing_ok=True)
    print("\n" + headline_table(rows))
    print(f"\n{len(rows)} steps in {total:.0f} s: {'all passed or skipped' if not bad else 'not ok: ' + ', '.join(bad)}"
          f"; results in {out}")
    if not args.keep_work and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not bad else 1


def setup_summary(setup: dict[str, Any]) -> dict[str, Any]:
    """What summary.json says of the set-up: the environment step's JSON has it all, but that step may fail."""
    wheels = setup.get("wheels") or {}
    return {"wheels": {k: wheels.get(k) for k in ("count", "installer", "seconds", "pip_failed", "error")}
            if wheels else None, "seconds": setup.get("seconds"), "missing": setup.get("missing"),
            "hibert_from": setup.get("hibert_from")}


def make_reference(args: argparse.Namespace) -> int:
    """The CPU loss curves step 4 compares against, written by this same code (device_steps.make_reference)."""
    args.dry_run = True   # CPU, gloo, DS_ACCELERATOR=cpu
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="hibert-device-reference-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    env, setup = step_env(args, work, SETUP_BOX_S)
    (work / "setup.json").write_text(json.dumps(setup))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--step", "make_reference", "--out", str(work),
           "--work", str(work), "--deadline", str(time.time() + 3600), "--dry-run"]
    code = subprocess.run(cmd, env=env, cwd=REPO).returncode
    if not args.keep_work and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return code


def run_one(args: argparse.Namespace) -> int:
    """Inside a step's process."""
    ctx = Context(Path(args.out), Path(args.work), args.dry_run, args.deadline)
    if args.step == "make_reference":
        sys.path.insert(0, str(HERE))
        import device_steps  # the project's imports: only now is the environment set up (module docstring)

        return device_steps.make_reference(ctx)
    step = next(s for s in STEPS if s.name == args.step)
    report = Report(ctx.out / step.file, step.name, {})
    report.update(machine=machine_block(ctx))
    # SIGTERM at the time box: a normal exit, so that `finally` blocks stop the runs a step started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if step.name == "environment":
            environment(report, ctx)
        else:
            sys.path.insert(0, str(HERE))
            import device_steps  # (as above)

            device_steps.STEPS[step.name](report, ctx)
    except Exception as e:  # the step's failure is its result; the suite goes on
        import traceback

        report.finish("failed", reason=f"{type(e).__name__}: {str(e)[:500]}", traceback=traceback.format_exc()[-3000:])
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="every step on CPU with tiny sizes (gloo, CUDA hidden)")
    p.add_argument("--out", default=None, help="output directory ($OUT wins; default runs/device-suite)")
    p.add_argument("--wheels", default=None, help="install these wheels (pip --no-index --no-deps --target) first")
    p.add_argument("--budget", type=int, default=None,
                   help=f"seconds for all steps (default {DEVICE_BUDGET_S}; dry run {DRY_BUDGET_S})")
    p.add_argument("--only", default=None, help="comma-separated steps: " + ",".join(s.name for s in STEPS))
    p.add_argument("--work", default=None, help="scratch directory (default: a new one under $TMPDIR, removed)")
    p.add_argument("--keep-work", action="store_true", help="keep the scratch directory (runs, logs, corpora)")
    p.add_argument("--make-reference", action="store_true",
                   help="write benchmarks/results/device_suite_reference_cpu.json (CPU loss curves)")
    p.add_argument("--stamp", action="store_true", help=f"write {STAMP.relative_to(REPO)} (commit + tree digest)")
    p.add_argument("--step", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.step:
        return run_one(args)
    if args.stamp:
        print(f"wrote {write_stamp()}")
        return 0
    if args.make_reference:
        return make_reference(args)
    return orchestrate(args)


if __name__ == "__main__":
    raise SystemExit(main())
