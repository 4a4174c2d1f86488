"""The documents' numbers name the commit that made them: every commit a README or docs page names must be
one of this repository's (a typo or a commit from an unpushed branch would leave a table nobody can rerun)."""
import re
import subprocess

import pytest

PAGES = ["README.md", "docs/*.md", "*/README.md", "docs/*/README.md"]   # as docs/tables.py's
NAMED = re.compile(r"\b(?:commits?|at|parent commit)\s+`?([0-9a-f]{7,40})\b")


def test_every_commit_a_document_names_is_in_the_history(repo):
    if subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=repo, capture_output=True,
                      text=True).stdout.strip() != "false":
        pytest.skip("needs the repository's history (not a shallow or exported copy)")
    named = {(str(page.relative_to(repo)), sha) for pattern in PAGES for page in sorted(repo.glob(pattern))
             for sha in NAMED.findall(page.read_text(encoding="utf-8"))}
    assert len(named) >= 10, named   # the docs name their commits; a pattern that finds none checks nothing
    missing = [(page, sha) for page, sha in sorted(named)
               if subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=repo).returncode != 0]
    assert not missing, f"commits named in the docs but not in this repository: {missing}"


# the pages kept to 120-character prose lines (code blocks, table rows and generated blocks aside)
SHORT_LINES = ["README.md", "docs/serving.md", "docs/cluster.md", "docs/experiments.md", "docs/abstractive.md",
               "docs/multi-document.md", "docs/results/README.md", "tests/README.md"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
TEST_NAMED = re.compile(r"`(test_\w+\.py)?(?:::(test_\w+))?`")


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of a page's prose: not in a code block, a table row or a generated block."""
    out, fence, generated = [], False, False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
        elif line.startswith("<!-- table: "):
            generated = True
        elif line.startswith("<!-- /table -->"):
            generated = False
        elif not (fence or generated or line.startswith("|")):
            out.append((n, line))
    return out


def test_the_readme_is_a_short_page_with_the_two_commands_and_where_to_go_next(repo):
    """README.md is read top to bottom: at most 180 lines; its quick start holds `make demo` and `make test`
    (the command .ci/run runs); serving and cluster use live in pages of their own, which it links, as every
    page it links exists."""
    text = (repo / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 180, len(text.splitlines())
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "\nmake demo " in quick and "\nmake test " in quick
    ci = (repo / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == "make test"   # the README's test command is what CI runs
    assert "\n## Results\n" in text and "](docs/experiments.md)" in text
    for page in ("docs/serving.md", "docs/cluster.md"):
        assert f"]({page})" in text
    for page in ("README.md", "docs/serving.md", "docs/cluster.md"):
        base = (repo / page).parent
        missing = [t for t in LINK.findall((repo / page).read_text(encoding="utf-8"))
                   if "://" not in t and not (base / t).exists()]
        assert not missing, f"{page} links to files that do not exist: {missing}"


def test_no_line_of_prose_is_longer_than_120_characters(repo):
    long = [(page, n, len(line)) for page in SHORT_LINES
            for n, line in _prose((repo / page).read_text(encoding="utf-8")) if len(line) > 120]
    assert not long, f"(page, line, characters) of prose lines over 120 characters: {long}"


def test_every_test_the_reliability_list_names_exists(repo):
    """docs/cluster.md's reliability list: a fault, what happens, the test that shows it. Each `test_x.py` and
    `test_x.py::test_y` (`::test_z`: the file named before it) must be a test file and a test of tests/."""
    text = (repo / "docs" / "cluster.md").read_text(encoding="utf-8").split("\n## Reliability\n", 1)[1]
    entries = [e for e in text.split("\n- **")[1:]]
    assert len(entries) >= 45, len(entries)   # every fault the list had when it moved from the README
    named, missing = 0, []
    for entry in entries:
        current = None
        for path, name in TEST_NAMED.findall(entry.split(" Test: ", 1)[-1]):
            current = path or current
            if current is None:
                continue
            named += 1
            source = repo / "tests" / current
            if not source.is_file() or (name and not re.search(rf"def {name}\b", source.read_text(encoding="utf-8"))):
                missing.append(f"{current}::{name}" if name else current)
    assert named >= 45 and not missing, missing
