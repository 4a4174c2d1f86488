"""What a bare GPU node has: the checkout as it is (no install) and its own torch, plus the device suite's carried
wheels (benchmarks/offline_bundle.sh --suite), which hold neither stanza nor spaCy. The checkout must import as the
installed package does, and PTB-tokenized sources must prepare without a segmenter."""
import json
import subprocess
import sys
import tomllib

from conftest import REPO

# stanza and spaCy absent in this process and in every process it starts (prep's workers): imports fail,
# find_spec says None, and their distributions have no metadata
HIDE = """
import importlib.metadata as md, sys
for name in ("stanza", "spacy"):
    sys.modules[name] = None
_version = md.version
def version(name):
    if name in ("stanza", "spacy"):
        raise md.PackageNotFoundError(name)
    return _version(name)
md.version = version
"""


def test_the_checkout_imports_its_folders_as_the_installed_package_does(tmp_path):
    """No install, no site-packages (so no editable finder): the repository root on sys.path, as `python -m
    hibert.cli` from the root or a benchmark script puts it, gives every package-dir subpackage of pyproject."""
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    code = ("import importlib.util as u, json, sys; sys.path.insert(0, sys.argv[1]); "
            "print(json.dumps({n: (s := u.find_spec(n)) and s.origin for n in sys.argv[2:]}))")
    others = ["hibert.tests", "hibert.benchmarks", "hibert.hibert"]   # the root's other folders stay out
    out = subprocess.run([sys.executable, "-S", "-c", code, str(REPO), *mapping, *others], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=True)
    found = json.loads(out.stdout)
    assert found == {name: str(REPO / folder / "__init__.py") for name, folder in mapping.items()} | {
        name: None for name in others}


def test_ptb_tokenized_sources_prepare_without_stanza_or_spacy(tmp_path):
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text(HIDE)
    # the hiding sitecustomize first on PYTHONPATH, whatever else the machine puts there
    env_code = ("import os, subprocess, sys; os.environ['PYTHONPATH'] = os.pathsep.join(filter(None, "
                "[sys.argv[1], os.environ.get('PYTHONPATH')])); "
                "sys.exit(subprocess.run([sys.executable, '-m', 'hibert.cli', *sys.argv[2:]]).returncode)")
    src = tmp_path / "cnn.jsonl"
    src.write_text("".join((REPO / "samples" / "cnndm_train_sample.jsonl").read_text().splitlines(True)[:30]))

    def prep(out: str, ptb: bool) -> subprocess.CompletedProcess:
        source = (f"{{format: jsonl, path: '{src}', text_field: article, id_field: idx, "
                  f"ptb_tokenized: {str(ptb).lower()}}}")
        return subprocess.run([sys.executable, "-c", env_code, str(tmp_path / "hide"), "prep",
                               f"data.output={tmp_path / out}", "data.tokenizer.vocab_size=300",
                               "data.tokenizer.hard_vocab_limit=false", "data.valid_fraction=0.1",
                               "data.test_fraction=0.0", "data.workers=2", "data.num_shards=2",
                               f"data.sources=[{source}]"], cwd=REPO, capture_output=True, text=True, timeout=300,
                              check=False)

    done = prep("ptb", ptb=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    manifest = json.loads((tmp_path / "ptb" / "manifest.json").read_text())
    assert manifest["segmenter"]["stanza_version"] == "not installed"
    assert manifest["segmenter"]["built_by"].startswith("not built: stanza is not installed")
    assert manifest["counts"]["docs_in"] == manifest["counts"]["kept"] == 30
    # a source that needs segmenting says what is missing, not a traceback
    refused = prep("raw", ptb=False)
    assert refused.returncode != 0
    assert "needs stanza and spacy, which this Python lacks" in refused.stderr + refused.stdout
    assert "ptb_tokenized: true need no segmenter" in refused.stderr + refused.stdout
