"""The documents' numbers name the commit that made them: every commit a README or docs page names must be
one of this repository's (a typo or a commit from an unpushed branch would leave a table nobody can rerun)."""
import re
import subprocess

import pytest

PAGES = ["README.md", "docs/*.md", "*/README.md"]
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
