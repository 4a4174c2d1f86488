import functools
import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# Tests never reach a hub or a GPU.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# registered models that `hibert evaluate/summarize` download: one cache for the session, not the user's ~/.cache
os.environ.setdefault("HIBERT_CACHE", tempfile.mkdtemp(prefix="hibert-test-cache-"))


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(autouse=True)
def _mlflow_process_state():
    """MLflow exports the URIs an in-process call sets ($MLFLOW_TRACKING_URI, $MLFLOW_REGISTRY_URI) to the
    environment, which every later `hibert` subprocess inherits (and then logs into another test's store): put
    the MLFLOW_* variables and MLflow's in-process URIs back after each test."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}
    yield
    for k in [k for k in os.environ if k.startswith("MLFLOW_") and k not in saved]:
        del os.environ[k]
    os.environ.update(saved)
    import sys

    if "mlflow" in sys.modules:
        import mlflow

        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)


# ---------------------------------------------------------------- shared prepared datasets
import subprocess as _subprocess
import sys as _sys

HIBERT = [_sys.executable, "-m", "hibert.cli"]


def run_hibert(args: list[str], timeout: int = 600, check: bool = True, **kw) -> _subprocess.CompletedProcess:
    """Run the real `hibert` command; on failure show its output."""
    out = _subprocess.run(HIBERT + [str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and out.returncode != 0:
        raise AssertionError(f"hibert {' '.join(map(str, args))} exited {out.returncode}\n"
                             f"--- stdout\n{out.stdout[-4000:]}\n--- stderr\n{out.stderr[-6000:]}")
    return out


def _subset(src: Path, dst: Path, n: int) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines()[:n]
    dst.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dst


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict[str, Path]:
    """Two prepared datasets from the shipped samples, sharing one small tokenizer:
    `open` (Reuters, no summaries) and `cnndm` (CNN/DM with summaries and oracle labels)."""
    root = tmp_path_factory.mktemp("tiny_data")
    reuters = _subset(REPO / "samples" / "reuters_sample.jsonl", root / "reuters.jsonl", 80)
    cnn_train = _subset(REPO / "samples" / "cnndm_train_sample.jsonl", root / "cnn_train.jsonl", 40)
    cnn_val = _subset(REPO / "samples" / "cnndm_val_sample.jsonl", root / "cnn_val.jsonl", 8)
    cnn_test = _subset(REPO / "samples" / "cnndm_test_sample.jsonl", root / "cnn_test.jsonl", 8)
    common = ["data.tokenizer.vocab_size=600", "data.valid_fraction=0.1", "data.test_fraction=0.0"]
    run_hibert(["prep", *common, f"data.output={root / 'open'}",
                f"data.sources=[{{format: jsonl, path: '{reuters}', text_field: body, id_field: newid, "
                f"title_field: title}}]"])
    cnn = ("format: jsonl, text_field: article, summary_field: highlights, id_field: idx, "
           "summary_sentence_sep: ' . ', ptb_tokenized: true")
    run_hibert(["prep", *common, f"data.output={root / 'cnndm'}",
                f"data.tokenizer.model={root / 'open' / 'tokenizer.model'}",
                f"data.sources=[{{{cnn}, path: '{cnn_train}', split: train}}, {{{cnn}, path: '{cnn_val}', split: valid}},"
                f" {{{cnn}, path: '{cnn_test}', split: test}}]"])
    return {"root": root, "open": root / "open", "cnndm": root / "cnndm"}


@functools.cache
def _store_template() -> Path:
    """One migrated MLflow sqlite store per test session, made by MLflow itself in a fresh process. A new store
    runs MLflow's schema migrations first (~6 s on 2 cores); the multi-process tests would make ~25 of them. They
    start from a copy of this one instead, as a user's later runs start from an existing store; the tests of
    store creation itself (the demo, the registry and outage tests) still create theirs."""
    import atexit
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="hibert-test-mlflow-"))
    atexit.register(shutil.rmtree, root, True)
    db = root / "mlflow.db"
    _subprocess.run([_sys.executable, "-c", "import mlflow, sys; mlflow.MlflowClient(sys.argv[1]).search_experiments()",
                     f"sqlite:///{db}"], check=True, capture_output=True, timeout=300)
    return db


def seed_store(db: Path) -> None:
    """Put a copy of the session's migrated store at `db` unless a store is already there."""
    import shutil

    if not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_store_template(), db)


def tiny_train_overrides(run_root: Path, name: str, dataset: Path, **extra) -> list[str]:
    """A tiny model and a short schedule for multi-process tests (its local store seeded: `seed_store`)."""
    uri = str(extra.get("tracking.uri", f"sqlite:///{Path(run_root) / 'mlflow.db'}"))
    if uri.startswith("sqlite:///"):
        seed_store(Path(uri[len("sqlite:///"):]))
    base = {"model": "hibert_tiny", "model.dropout": 0.0, "run.output_dir": run_root, "run.name": name,
            "data.dataset": dataset, "data.num_workers_loader": 1, "schedule.batch_tokens": 1500,
            "schedule.max_docs_per_batch": 16, "schedule.warmup_steps": 2, "schedule.log_every": 1,
            "schedule.eval_every": 0, "schedule.epochs": 20, "optimizer.lr": 1e-3,
            "checkpoint.every_steps": 2, "checkpoint.keep_last": 5, "checkpoint.keep_best": 0,
            "deepspeed.zero_stage": 2}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


# ---------------------------------------------------------------- a size-limited filesystem
class SmallDisk:
    """A tmpfs mounted for one test; `resize` changes its size and keeps its files (mount -o remount)."""

    def __init__(self, path: Path):
        self.path = path

    def resize(self, size: str) -> None:
        out = _subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


@pytest.fixture
def small_disk(tmp_path):
    """Full-disk tests need a filesystem that fills up: a tmpfs (root only; skipped with the reason otherwise)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    out = _subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield SmallDisk(mnt)
    finally:
        _subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory this process cannot write: a read-only tmpfs as root (root ignores permission bits), else
    mode 0555; skipped with the reason where neither holds."""
    ro = tmp_path / "read-only"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)
        return
    out = _subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True, text=True,
                          check=False)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {out.stderr.strip()}")
    try:
        yield ro
    finally:
        _subprocess.run(["umount", "-l", str(ro)], capture_output=True, check=False)


# ---------------------------------------------------------------- a real headless browser
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def render_in_chromium(page: Path, fragment: str = "", screenshot: Path | None = None) -> str:
    """The DOM of a local page after its scripts ran, in Debian's chromium (installed by .ci/run); with
    `screenshot`, also a 1280x900 PNG of it. Skips, saying why, where chromium is not installed."""
    import shutil
    import tempfile

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium)")
    url = f"file://{Path(page).resolve()}" + (f"#{fragment}" if fragment else "")
    with tempfile.TemporaryDirectory() as profile:
        base = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
        dom = _subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120)
        assert dom.returncode == 0 and "<body" in dom.stdout, dom.stderr[-2000:]
        if screenshot is not None:
            shot = _subprocess.run([*base, "--window-size=1280,900", f"--screenshot={screenshot}", url],
                                   capture_output=True, text=True, timeout=120)
            assert shot.returncode == 0 and Path(screenshot).is_file(), shot.stderr[-2000:]
    return dom.stdout
