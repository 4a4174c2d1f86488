"""The package as users install it: a wheel built from this tree carries the shipped configs, so recipes
and section files load from a plain install, away from the source checkout."""
import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_wheel_install_loads_shipped_configs(repo, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(repo, src, ignore=shutil.ignore_patterns(".venv", ".git", "runs", "samples", "tests",
                                                             "build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=240)
    wheel = next((tmp_path / "dist").glob("hibert_platform-*.whl"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=240)
    # one import name: the card's folders install under `hibert` (hibert.modeling, ...), nothing generic at the top
    assert sorted(p.name for p in target.iterdir() if p.is_dir() and not p.name.endswith(".dist-info")
                  and p.name != "bin") == ["hibert"]
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    probe = ("import hibert, hibert.modeling, hibert.heads; from hibert.config import load_config; "
             "from hibert.config.load import configs_root; "
             "c = load_config('giga-cm', ['model=hibert_s', 'deepspeed=zero3']); "
             "print(hibert.__file__); print(configs_root()); print(c.model.hidden, c.deepspeed.zero_stage)")
    env = {k: v for k, v in os.environ.items() if k != "HIBERT_CONFIG_DIR"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPATH": str(target)}, check=True)
    module, root, values = out.stdout.strip().splitlines()
    assert module.startswith(str(target)) and root.startswith(str(target)), out.stdout
    assert values == "512 3"
