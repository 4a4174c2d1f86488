"""`hibert compare` on hand-made reports: pairing by document id, the reference's sign, another row of a
report (`#lead3`), and the errors."""
import json

import pytest

from hibert.errors import UserError
from hibert.finetune.evaluation.rouge import paired_bootstrap, seeded_paired_bootstrap
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


def test_only_an_explicit_name_pools_seeds_and_a_report_counts_once(tmp_path):
    """Unnamed runs that share a directory name are two systems (named with their parent); the same report
    listed twice is refused (it would pass for two agreeing seeds); the same report's other row is not."""
    ids = ["d1", "d2"]
    e1 = _report(tmp_path / "exp1" / "ext" / "report-test", ids, [10.0, 30.0], lead=[5.0, 5.0])
    e2 = _report(tmp_path / "exp2" / "ext" / "report-test", ids, [90.0, 90.0])
    other = _report(tmp_path / "exp3" / "other" / "report-test", ids, [50.0, 50.0])
    out = compare([str(e1.parent), str(e2.parent), str(other.parent)], "test", 50)
    assert {k: v["seeds"] for k, v in out["systems"].items()} == {"exp1/ext": 1, "exp2/ext": 1, "other": 1}
    assert out["paired"]["exp2/ext-exp1/ext"]["rouge1_f"]["diff"] == pytest.approx(70.0)
    out = compare([f"ext={e1.parent}", str(e2.parent), f"{e1}#lead3"], "test", 50)   # an explicit name is taken
    assert list(out["systems"]) == ["ext", "exp2/ext", "ext#lead3"]
    assert compare([f"P={e1.parent}", f"P={e2.parent}", str(other.parent)], "test", 50)["systems"]["P"]["seeds"] == 2
    with pytest.raises(UserError, match="one report .* listed twice"):
        compare([f"x={e1.parent}", f"x={e1 / 'report.json'}", f"y={other.parent}"], "test", 50)
    nocap = _report(tmp_path / "exp1" / "ext" / "report-test-nocap", ids, [20.0, 20.0])
    with pytest.raises(UserError, match="would both be named"):   # two reports of one run: no path tells them apart
        compare([str(nocap), str(e1.parent), str(other.parent)], "test", 50)


def test_a_name_is_what_comes_before_the_first_equals_sign(tmp_path):
    """`lr=runs/sweep/lr=1e-4`: NAME lr, the path keeps its '='; an unnamed path with '=' is all path."""
    base = _report(tmp_path / "base" / "report-test", ["d1"], [1.0])
    lr = _report(tmp_path / "sweep" / "lr=1e-4" / "report-test", ["d1"], [3.0])
    assert list(compare([f"base={base}", f"lr={lr.parent}"], "test", 20)["paired"]) == ["lr-base"]
    assert list(compare([f"base={base}", str(lr.parent)], "test", 20)["paired"]) == ["lr=1e-4-base"]


def test_evaluate_compare_names_stay_apart_and_never_replace_a_baseline_pair(tmp_path):
    """`hibert evaluate --compare`: same-named runs get their parent in front instead of one replacing the other;
    a name equal to a row of the report (lead3) or to another --compare name, or a report listed twice, is
    refused; a pair already in the report is never replaced."""
    from hibert.finetune.evaluation.report import compared_reports, pair_with_reports

    e1 = _report(tmp_path / "exp1" / "ext" / "report-test", ["a"], [10.0])
    e2 = _report(tmp_path / "exp2" / "ext" / "report-test", ["a"], [90.0])
    lr = _report(tmp_path / "sweep" / "lr=1e-4", ["a"], [20.0])
    reports = compared_reports([str(e1.parent), str(e2.parent), f"lr={lr}"], "test")
    assert list(reports) == ["exp1/ext", "exp2/ext", "lr"] and reports["exp2/ext"]["per_document"]["model"]
    for bad, match in (([f"lead3={e1}"], "'lead3' is a row of this report"), ([f"x={e1}", f"x={e2}"], "two reports"),
                       ([str(e1.parent), f"y={e1}"], "listed twice")):
        with pytest.raises(UserError, match=match):
            compared_reports(bad, "test")
    result = {"doc_ids": ["a"], "per_document": {"model": {m: [50.0] for m in METRICS}},
              "paired": {"model-tfidf": {"rouge1_f": {"diff": 5.0}}}}
    with pytest.raises(UserError, match="--compare tfidf: the name of a row"):
        pair_with_reports(result, {"tfidf": reports["lr"]}, 10)
    assert result["paired"]["model-tfidf"] == {"rouge1_f": {"diff": 5.0}}


def test_demo_runner_pairs_over_shared_documents_and_its_seed_ci_is_over_documents(capsys):
    """The local runner's summary: reports whose document lists differ are paired over the documents they share
    (named when they share none), and a system's multi-seed interval is the bootstrap over documents of the
    per-document mean over seeds (not the mean of the per-seed bounds)."""
    from hibert.finetune.evaluation.rouge import bootstrap_ci
    from hibert.slurm.local import print_paired, seed_summary

    def rep(ids, scores, init, bounds=(0.0, 100.0)):
        per = {m: scores for m in METRICS}
        return {"meta": {"encoder_init": init}, "per_document": {"doc_ids": ids, "model": per},
                "scores": {"model": {m: {"mean": sum(scores) / len(scores), "low": bounds[0], "high": bounds[1]}
                                     for m in METRICS}}}

    rand = rep(["d1", "d2", "d3"], [10.0, 20.0, 30.0], None)
    pre = rep(["d3", "d2"], [33.0, 24.0], "enc")           # other order, one document fewer
    apart = rep(["x"], [1.0], "enc")
    print_paired([("random", rand), ("pre", pre), ("apart", apart)])
    out = capsys.readouterr().out
    assert "pre - random (paired bootstrap, 2 documents of 3, 1/1 seeds):  rouge1 +3.50" in out
    assert "apart - random: not paired (no documents in common)" in out
    two = seed_summary([rep(["d1", "d2"], [10.0, 20.0], "enc"), rep(["d2", "d1"], [40.0, 30.0], "enc")])
    assert two["rouge1_f"]["mean"] == pytest.approx(25.0)
    assert (two["rouge1_f"]["low"], two["rouge1_f"]["high"]) == bootstrap_ci([20.0, 30.0])   # per-document means


def test_results_files_pool_as_seeds_and_reproduce_their_paired_tests(tmp_path, capsys):
    """An experiment's units each commit a results file; `NAME=FILE#SYSTEM` takes every seed of SYSTEM from one,
    so the pooled comparison runs without the reports: on a committed file it gives back the file's own paired
    test digit for digit, and the seeds keep the facts the file recorded."""
    from conftest import REPO
    from hibert.cli import main

    src = REPO / "docs" / "results" / "pretrain-gain-cnndm.json"
    want = json.loads(src.read_text())
    out = tmp_path / "pooled.json"
    assert main(["compare", f"random={src}#random", f"open-in={src}#open-in", "--results", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["paired"]["open-in-random"] == want["paired"]["open-in-random"]
    assert got["systems"]["open-in"]["per_document"] == want["systems"]["open-in"]["per_document"]
    runs = got["systems"]["open-in"]["runs"]
    assert [r["run_dir"] for r in runs] == [r["run_dir"] for r in want["systems"]["open-in"]["runs"]]
    assert runs[0]["encoder"] == want["systems"]["open-in"]["runs"][0]["encoder"]
    capsys.readouterr()
    assert main(["compare", f"x={src}#nope"]) == 1
    assert "name a system of the results file" in capsys.readouterr().err
    assert main(["compare", f"a={src}#random", f"b={src}#random"]) == 1     # one seed counted twice
