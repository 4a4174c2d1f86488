"""DeepSpeed's JIT op builds and the lock torch guards them with (hibert/runtime/build_locks.py): a run killed
during a build must not hang every later run on its lock."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from hibert.errors import UserError
from hibert.runtime import build_locks


def _lock(root, op, age_s):
    lock = root / op / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    t = time.time() - age_s
    os.utime(lock, (t, t))
    return lock


def test_a_stale_lock_is_one_line_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = _lock(tmp_path, "cpu_adam", age_s=build_locks.STALE_AFTER_S + 5)
    with pytest.raises(UserError, match=f"rm {lock}"):
        build_locks.wait_for_build_lock("cpu_adam", sleep=lambda s: pytest.fail("waited on a stale lock"))


def test_a_build_in_progress_is_waited_for_and_a_lock_that_outlives_the_wait_is_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = _lock(tmp_path, "cpu_adam", age_s=0)
    now = [time.time()]
    naps = []

    def sleep(s):
        naps.append(s)
        now[0] += s
        if len(naps) == 3:
            lock.unlink()            # the build finishes

    build_locks.wait_for_build_lock("cpu_adam", poll_s=1.0, clock=lambda: now[0], sleep=sleep)
    assert naps == [1.0, 1.0, 1.0]
    _lock(tmp_path, "fused", age_s=0)
    now[0] = time.time()
    with pytest.raises(UserError, match="build lock"):   # nobody removes it: stale once it is STALE_AFTER_S old
        build_locks.wait_for_build_lock("fused", poll_s=60.0, clock=lambda: now[0],
                                        sleep=lambda s: now.__setitem__(0, now[0] + s))


def test_no_lock_no_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    build_locks.wait_for_build_lock("cpu_adam", sleep=lambda s: pytest.fail("waited without a lock"))


CHILD = textwrap.dedent("""
    from hibert.config import load_config
    from hibert.runtime.engine import init_distributed
    init_distributed(load_config(None, []))
    print("ok")
""")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_dead_shm_build_lock_does_not_hang_distributed_init(tmp_path):
    """The reproduction of a kill -9 during DeepSpeed's shared-memory op build: its lock left behind. Before
    the fix init_distributed built that op and waited on the lock forever."""
    ext = tmp_path / "ext"
    _lock(ext, "deepspeed_shm_comm", age_s=0)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "CUDA_VISIBLE_DEVICES": ""}
    try:
        out = subprocess.run([sys.executable, "-c", CHILD], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("init_distributed waited on the dead build lock")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    assert not (ext / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").exists()   # never built
