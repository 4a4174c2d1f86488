"""Bylines and time stamps removed from the head of a news article (data_prep/bylines.py): hand-checked cases
in the CNN/DM release's form (lowercased, PTB-tokenized), and the command's counts."""
import json
import subprocess
import sys

import pytest

from hibert.data_prep.bylines import strip_byline


@pytest.mark.parametrize("article,clean", [
    ("by . rob waugh . published : . 14:00 est , 19 march 2012 . | . updated : . 14:01 est , 19 march 2012 . "
     "the early history of civilisation has been filled in .", "the early history of civilisation has been filled in ."),
    ("by . daily mail reporter . last updated at 7:37 am on 22nd june 2011 . a doctor walked free .",
     "a doctor walked free ."),
    ("by . chris wheeler . follow @@ chriswheelerdm . the squad trained .", "the squad trained ."),
    # no byline: unchanged (CNN's dateline belongs to the first sentence)
    ("-lrb- cnn -rrb- the second mate could n't believe it .", "-lrb- cnn -rrb- the second mate could n't believe it ."),
    ("by the river , two men fished . they caught nothing .", "by the river , two men fished . they caught nothing ."),
    # a story's own first sentence is not a stamp: a stamp has ": ." (or "at") and a time or a year
    ("published figures show the city is among the safest . the report", None),
    ("created by a team of engineers in 2013 . it works .", None),
    ("updated rules for the program . teams agree .", None),
    ("published : . 02:58 est , 14 june 2012 . | . updated : . 03:01 est , 14 june 2012 . oxfam is calling .",
     "oxfam is calling ."),
])
def test_strip_byline_hand_checked(article, clean):
    assert strip_byline(article) == (article if clean is None else clean)


def test_the_command_counts_every_record(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        json.dumps({"idx": 1, "article": "by . jane doe . published : . 10:59 est , 25 april 2012 . a story ."}),
        json.dumps({"idx": 2, "article": "a story without a byline ."}),
        json.dumps({"idx": 3, "article": "by . jane doe . published : . 10:59 est , 25 april 2012 . "}),
        "not json"]) + "\n")
    out = subprocess.run([sys.executable, "-m", "hibert.data_prep.bylines", str(src), str(tmp_path / "out.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "4 records" in out.stdout and "1 changed, 1 unchanged, 2 skipped" in out.stdout
    recs = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert recs == [{"idx": 1, "article": "a story ."}, {"idx": 2, "article": "a story without a byline ."}]
