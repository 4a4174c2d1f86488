"""`hibert compare` on hand-made reports: pairing by document id, the reference's sign, another row of a
report (`#lead3`), and the errors."""
import json

import pytest

from hibert.errors import UserError
from hibert.finetune.base.rouge import paired_bootstrap, seeded_paired_bootstrap
from hibert.finetune.compare import compare, render
from hibert.cli import main

METRICS = ("rouge1_f", "rouge2_f", "rougeL_f", "rougeLsum_f")


def _report(path, ids, model, lead=None):
    per_doc = {"doc_ids": ids, "model": {m: model for m in METRICS}}
    if lead is not None:
        per_doc["lead3"] = {m: lead for m in METRICS}
    path.mkdir(parents=True)
    (path / "report.json").write_text(json.dumps({"per_document": per_doc}))
    return path


def test_pairs_over_shared_documents_against_the_first(tmp_path):
    a = _report(tmp_path / "a" / "report-test", ["d1", "d2", "d3"], [10.0, 20.0, 30.0], lead=[5.0, 5.0, 5.0])
    b = _report(tmp_path / "b" / "report-test", ["d3", "d2", "d9"], [36.0, 24.0, 99.0])
    out = compare([str(tmp_path / "a"), f"bee={b}", f"{a}#lead3"], "test", 200)
    assert out["reference"] == "a" and set(out["systems"]) == {"a", "bee", "a#lead3"}
    pair = out["paired"]["bee-a"]
    assert pair["documents"] == 2 and pair["rouge1_f"]["diff"] == pytest.approx(5.0)  # (36-30 + 24-20) / 2
    assert out["paired"]["a#lead3-a"]["rouge2_f"]["diff"] == pytest.approx(-15.0)
    assert out["systems"]["bee"]["rouge1_f"]["mean"] == pytest.approx(53.0)


def test_cli_table_and_errors(tmp_path, capsys):
    a = _report(tmp_path / "a", ["d1", "d2"], [10.0, 20.0])
    b = _report(tmp_path / "b", ["d1", "d2"], [12.0, 22.0])
    assert main(["compare", str(a), str(b), "--bootstrap", "100", "--json", str(tmp_path / "t.json")]) == 0
    printed = capsys.readouterr().out
    assert "| b-a | 2 | 1/1 | +2.00" in printed and "One seed behind some system" in printed
    assert json.loads((tmp_path / "t.json").read_text())["paired"]["b-a"]["rougeL_f"]["diff"] == pytest.approx(2.0)
    with pytest.raises(UserError, match="no per-document scores for 'oracle'"):
        compare([str(a), f"{b}#oracle"], "test", 10)
    with pytest.raises(UserError, match="no report.json"):
        compare([str(a), str(tmp_path / "nowhere")], "test", 10)
    c = _report(tmp_path / "c", ["x"], [1.0])
    with pytest.raises(UserError, match="shares no documents"):
        compare([str(a), str(c)], "test", 10)


def test_seeds_of_one_system_are_averaged_and_resampled(tmp_path):
    """Reports under one NAME are seeds. R: one seed, scores 10..40. P: three seeds, R + 6, R + 6 and R - 6 on
    every document: P - R = +2 on each document once averaged over seeds — a documents-only bootstrap of
    that would call it a sure gain (CI [2, 2]) — but one seed in three is 6 below R, and resampling the seeds
    (all three can be the bad one) puts the interval across 0: no measurable difference."""
    ids = ["d1", "d2", "d3", "d4"]
    ref = [10.0, 20.0, 30.0, 40.0]
    r = _report(tmp_path / "r", ids, ref)
    seeds = [_report(tmp_path / f"p{k}", ids, [x + shift for x in ref]) for k, shift in enumerate((6.0, 6.0, -6.0))]
    out = compare([f"R={r}", *(f"P={p}" for p in seeds)], "test", 400)
    p_row = out["systems"]["P"]
    assert p_row["seeds"] == 3 and out["systems"]["R"]["seeds"] == 1
    assert p_row["rouge1_f"]["seed_means"] == pytest.approx([31.0, 31.0, 19.0])
    assert p_row["rouge1_f"]["mean"] == pytest.approx(27.0)
    assert p_row["rouge1_f"]["seed_sd"] == pytest.approx(12 / 3 ** 0.5)     # sd of (31, 31, 19), ddof 1
    pair = out["paired"]["P-R"]
    assert pair["seeds"] == [3, 1] and pair["rouge1_f"]["diff"] == pytest.approx(2.0)
    assert pair["rouge1_f"]["low"] < 0 < pair["rouge1_f"]["high"]
    assert pair["rouge1_f"]["verdict"] == "no measurable difference"
    docs_only = paired_bootstrap([x + 2 for x in ref], ref, 400)
    assert docs_only["low"] == docs_only["high"] == pytest.approx(2.0)        # what one averaged row would claim
    assert "no measurable difference" in render(out) and "| P | 4 | 3 |" in render(out)
    # one seed each: exactly the documents-only paired bootstrap
    one = seeded_paired_bootstrap([[1.0, 5.0, 2.0]], [[0.0, 1.0, 3.0]], 300)
    assert {k: one[k] for k in ("diff", "low", "high", "p_value")} == \
        {k: v for k, v in paired_bootstrap([1.0, 5.0, 2.0], [0.0, 1.0, 3.0], 300).items() if k != "resamples"}


def test_unit_ranking_reports_pair_per_cluster_at_every_cut(tmp_path):
    """Ranker reports (`per_cluster`: recall of the top L' units per cluster) pair like summaries: `ranker` is
    the default row, `#tfidf` another; seeds average per cluster; mixing kinds is refused."""
    def ranking(path, ids, ranker, tfidf):
        path.mkdir(parents=True)
        per = {"doc_ids": ids, "ranker": {"5": ranker, "10": [x + 10 for x in ranker]},
               "tfidf": {"5": tfidf, "10": [x + 10 for x in tfidf]}}
        (path / "report.json").write_text(json.dumps({"recall": {}, "per_cluster": per}))
        return path

    ids = ["c1", "c2", "c3"]
    a = [ranking(tmp_path / f"a{s}", ids, [40.0 + s, 50.0, 60.0], [30.0, 30.0, 30.0]) for s in (0, 2)]
    b = ranking(tmp_path / "b", ids, [44.0, 52.0, 57.0], [30.0, 30.0, 30.0])
    out = compare([f"tfidf={a[0]}#tfidf", *(f"A={p}" for p in a), f"B={b}"], "test", 200)
    assert out["metrics"] == ["recall@5", "recall@10"]
    assert out["systems"]["A"]["recall@5"]["seed_means"] == pytest.approx([50.0, 50 + 2 / 3])
    assert out["paired"]["A-tfidf"]["recall@5"]["diff"] == pytest.approx(20 + 1 / 3)   # A's seeds averaged
    assert out["paired"]["B-tfidf"]["recall@10"]["diff"] == pytest.approx(51 - 30)
    assert "recall@5 reads" in render(out) and "recall of the top L' units" in render(out)
    summary = _report(tmp_path / "s", ids, [1.0, 2.0, 3.0])
    with pytest.raises(UserError, match="different kinds"):
        compare([str(a[0]), str(summary)], "test", 10)
