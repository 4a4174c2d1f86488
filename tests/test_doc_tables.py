"""Tables as data: the docs' generated tables are what docs/tables.py renders from their results files, and
`hibert compare --results` writes such a file (schema hibert-results/1) from hand-made report.json sets — one
commit per file unless mixing is asked for."""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hibert.cli import main as hibert
from hibert.finetune.evaluation.rouge import seeded_paired_bootstrap
from hibert.finetune.results_file import SCHEMA, model_commit

METRICS = ("rouge1_f", "rouge2_f", "rougeL_f", "rougeLsum_f")
IDS = ["d1", "d2", "d3", "d4"]
C1, C2 = "1" * 40, "2" * 40


def _tables():
    """docs/tables.py as a module (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("doc_tables", Path(__file__).parents[1] / "docs" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclass looks its module up while the class is made
    spec.loader.exec_module(module)
    return module


def _run(root: Path, name: str, seed: int, scores: list[float], commit: str, lead: list[float] | None = None) -> str:
    """A run directory as training and `hibert evaluate` leave it: config.resolved.yaml, export/export.json
    (git_commit, the MLflow run) and report-test/report.json in the shape finetune/evaluation/report.py writes."""
    run = root / "runs" / name
    (run / "export").mkdir(parents=True)
    (run / "report-test").mkdir()
    (run / "config.resolved.yaml").write_text(yaml.safe_dump({"run": {"name": name, "seed": seed}}))
    (run / "export" / "export.json").write_text(json.dumps({"git_commit": commit, "mlflow_run_id": f"mlf-{name}",
                                                            "final_metrics": {"valid_ppl": 500.0 + 10 * seed}}))
    per_doc = {"model": {m: scores for m in METRICS}, **({"lead3": {m: lead for m in METRICS}} if lead else {})}
    words = {"model": {"mean_words": 9.0 + seed}, **({"lead3": {"mean_words": 80.0}} if lead else {})}
    report = {"meta": {"task": "extractive", "model": f"runs/{name}/export", "split": "test",
                       "finetune_run": f"mlf-{name}"},
              "num_documents": len(IDS), "scores": {}, "paired": {}, "abstractiveness": words,
              "per_document": {"doc_ids": IDS, **per_doc}, "multi_reference": "single"}
    (run / "report-test" / "report.json").write_text(json.dumps(report, indent=1))
    return f"runs/{name}"


def _two_systems(root: Path, commit_of_p: str = C1) -> list[str]:
    """R: seeds 1, 2; P: seeds 1, 2, about 4 points above R on every document (scores with 6 decimals)."""
    ref = [10.123456, 20.0, 30.0, 40.0]
    r = [_run(root, f"r-seed{s}", s, [x + s for x in ref], C1, lead=[5.0] * 4) for s in (1, 2)]
    p = [_run(root, f"p-seed{s}", s, [x + 4 + s for x in ref], commit_of_p) for s in (1, 2)]
    return [*(f"R={x}" for x in r), *(f"P={x}" for x in p)]


def test_the_docs_tables_are_what_their_results_files_render(repo):
    out = subprocess.run([sys.executable, "docs/tables.py", "--check"], cwd=repo, capture_output=True, text=True,
                         check=False, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    marked = sum(p.read_text(encoding="utf-8").count("<!-- table: ") for p in _tables().pages(repo))
    assert marked >= 2   # a check over no table checks nothing


def test_compare_writes_a_results_file_the_tables_render(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    items = _two_systems(tmp_path)
    out = tmp_path / "docs" / "results" / "toy.json"
    assert hibert(["compare", *items, "lead=runs/r-seed1#lead3", "--bootstrap", "200", "--results", str(out)]) == 0
    assert f"results: {out}" in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["schema"] == SCHEMA and res["reference"] == "R" and res["documents"] == 4
    assert res["model_commit"] == C1 and list(res["model_commits"]) == [C1]
    assert res["model_commits"][C1] == ["runs/r-seed1", "runs/r-seed2", "runs/p-seed1", "runs/p-seed2"]
    made = res["made"]
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", made["commit"]) and made["clean"] in (True, False, None)
    assert made["command"] == ("hibert compare R=runs/r-seed1 R=runs/r-seed2 P=runs/p-seed1 P=runs/p-seed2 "
                               f"'lead=runs/r-seed1#lead3' --bootstrap 200 --results {out}")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", made["date"])
    p = res["systems"]["P"]
    assert p["seeds"] == 2 and [r["seed"] for r in p["runs"]] == [1, 2]
    assert p["runs"][0] == {"run_dir": "runs/p-seed1", "report": "runs/p-seed1/report-test/report.json",
                            "row": "model", "seed": 1, "model_commit": C1, "last_valid": {"valid_ppl": 510.0},
                            "words": 10.0}
    # a baseline row was not trained: its words, no validation metrics
    assert res["systems"]["lead"]["runs"][0] == {"run_dir": "runs/r-seed1", "report": "runs/r-seed1/report-test/"
                                                 "report.json", "row": "lead3", "seed": 1, "model_commit": C1,
                                                 "words": 80.0}
    assert p["scores"]["rouge1_f"]["seed_means"] == pytest.approx([25.030864 + 5, 25.030864 + 6])
    assert p["per_document"]["doc_ids"] == IDS and p["per_document"]["rouge2_f"][0][0] == 15.1235   # 4 decimals
    pair = res["paired"]["P-R"]
    assert pair["system"] == "P" and pair["reference"] == "R" and pair["seeds"] == [2, 2]
    assert pair["rouge1_f"]["diff"] == pytest.approx(4.0) and pair["rouge1_f"]["verdict"] == "higher"
    # the per-document scores rerun the paired test without the reports, to the digit
    again = seeded_paired_bootstrap(p["per_document"]["rougeL_f"], res["systems"]["R"]["per_document"]["rougeL_f"],
                                    200)
    assert {k: round(again[k], 6) for k in ("diff", "low", "high", "p_value")} == \
        {k: pair["rougeL_f"][k] for k in ("diff", "low", "high", "p_value")}
    assert out.stat().st_size < 16_000

    tables = _tables()
    page = tmp_path / "README.md"
    page.write_text("# toy\n\n<!-- table: docs/results/toy.json rouge-seeds -->\n<!-- /table -->\n\ntext\n\n"
                    "<!-- table: docs/results/toy.json paired -->\nstale\n<!-- /table -->\n"
                    "<!-- table: docs/results/toy.json training -->\n<!-- /table -->\n")
    assert tables.main(["--check"], root=tmp_path) == 1          # the blocks are not what the file renders
    assert tables.main([], root=tmp_path) == 0 and tables.main(["--check"], root=tmp_path) == 0
    text = page.read_text()
    assert "| P | 4 | 1/2 | 30.53 [" in text and " ± 0.71 (30.03 / 31.03) |" in text   # seeds 1/2, per-seed means
    assert "| system | documents | seeds | R1 | R2 | RL | RLsum |" in text and "stale" not in text
    assert "| P − R | 4 | 2/2 | +4.00 [+3.00, +5.00] p<0.005 |" in text and text.count("| higher |") == 1
    assert "| lead − R | 4 | 1/2 | −" in text and "| lower |" in text
    assert "| system | seeds | ppl (valid, last step) | words |" in text
    assert "| P | 1/2 | 515 ± 7 (510 / 520) | 10.50 ± 0.71 (10.00 / 11.00) |" in text
    assert "| lead | 1 |  | 80.00 |" in text
    # one provenance line per results file on a page, under its first table; the later tables say so. Without a
    # docs/results/make_*.sh naming the file, the line gives the file's own command, whole
    lines = text.splitlines()
    made = [i for i, line in enumerate(lines) if line.startswith("Made at")]
    same = [i for i, line in enumerate(lines) if line == "Same results file as above (docs/results/toy.json)."]
    assert len(made) == 1 and len(same) == 2 and made[0] < same[0]
    end = next(i for i in range(made[0], len(lines)) if lines[i].endswith("; docs/results/toy.json)."))
    provenance = " ".join(lines[made[0]:end + 1])
    assert provenance.startswith(f"Made at commit {C1[:7]} by `{res['made']['command']}`")
    assert f" ({res['made']['date']}; the code at " in provenance
    # the block's first line under each table is the one saying what made it (or that a table above says it)
    under = [i + 2 for i, line in enumerate(lines) if line.startswith("|") and not lines[i + 1].startswith("|")]
    assert [i for i in under if lines[i - 1] == ""] == [*made, *same]
    # generated prose is wrapped at 120 characters; only the tables' rows are longer
    assert all(len(line) <= 120 for line in lines if not line.startswith("|"))


def test_a_results_file_names_its_make_script_once_per_page_and_lists_its_command(tmp_path, monkeypatch):
    """The provenance line names the docs/results/make_*.sh whose `--results` writes the file (shell variables
    read as any text; the most literal name wins), on the first table of the file on each page; the
    `provenance` view lists every hibert-results/1 file of a glob with its full command, other JSON passed over."""
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    assert hibert(["compare", *_two_systems(tmp_path), "--bootstrap", "50", "--results",
                   "docs/results/toy-test.json"]) == 0
    command = json.loads((results / "toy-test.json").read_text())["made"]["command"]
    (results / "make_toy.sh").write_text('R=docs/results\nfor set in test valid; do\n  hibert compare a=x \\\n'
                                         '    --split "$set" --results "$R/toy-$set.json"\ndone\n')
    (results / "make_toy_arms.sh").write_text("hibert compare a=x --results docs/results/toy-${SET}-$ARM.json\n")
    (results / "record.json").write_text(json.dumps({"schema": "a pretraining record", "steps": 3}))
    tables = _tables()
    assert tables.make_script(tmp_path, "docs/results/toy-test.json") == "docs/results/make_toy.sh"
    assert tables.make_script(tmp_path, "docs/results/toy-full-random.json") == "docs/results/make_toy_arms.sh"
    assert tables.make_script(tmp_path, "docs/results/other.json") is None
    block = "<!-- table: docs/results/toy-test.json {} -->\n<!-- /table -->\n"
    (tmp_path / "README.md").write_text(block.format("rouge-seeds") + "text\n" + block.format("paired"))
    (tmp_path / "docs" / "other.md").write_text(block.format("paired"))
    (results / "README.md").write_text("<!-- table: docs/results/*.json provenance -->\n<!-- /table -->\n")
    assert tables.main([], root=tmp_path) == 0 and tables.main(["--check"], root=tmp_path) == 0
    first = (f"Made at commit {C1[:7]} by `bash docs/results/make_toy.sh` (")
    readme, other = (tmp_path / "README.md").read_text(), (tmp_path / "docs" / "other.md").read_text()
    assert readme.count(first) == 1 and other.count(first) == 1     # once per page
    assert readme.count("Same results file as above (docs/results/toy-test.json).") == 1
    assert readme.index(first) < readme.index("Same results file as above") and command not in readme
    listing = (results / "README.md").read_text()
    assert listing.count(first) == 1 and "record.json" not in listing and "listed in" not in listing
    code = listing.split("```\n")[1].splitlines()
    assert all(len(line) <= 102 for line in code)
    assert " ".join(line.removesuffix(" \\").strip() for line in code) == command   # the command, whole
    (results / "README.md").write_text("<!-- table: docs/results/record.json provenance -->\n<!-- /table -->\n")
    with pytest.raises(tables.TableError, match="reads hibert-results/1 files"):
        tables.render_page((results / "README.md").read_text(), tmp_path)


def test_reports_of_models_made_at_different_commits_are_refused_unless_allowed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    items = _two_systems(tmp_path, commit_of_p=C2)
    out = tmp_path / "mixed.json"
    assert hibert(["compare", *items, "--bootstrap", "50", "--results", str(out)]) == 1
    err = capsys.readouterr().err
    assert "2 different commits" in err and f"{C1}: runs/r-seed1, runs/r-seed2" in err
    assert f"{C2}: runs/p-seed1, runs/p-seed2" in err and "--allow-mixed-commits" in err
    assert not out.exists()
    assert hibert(["compare", *items, "--bootstrap", "50", "--results", str(out), "--allow-mixed-commits"]) == 0
    res = json.loads(out.read_text())
    assert res["model_commit"] is None and list(res["model_commits"]) == [C1, C2]
    assert res["made"]["command"].endswith("--allow-mixed-commits")
    assert f"Made at several commits ({C1[:7]}, {C2[:7]}) by `hibert compare" in _tables().made_line(res, "mixed.json")


def test_the_encoders_a_system_was_finetuned_from_are_kept_and_shown_once_each(tmp_path, monkeypatch):
    """`hibert compare --results` keeps each finetuning's encoder (its `init/export.json` copy: stage, init, step,
    the pretraining objective's last validation metrics, commit); the `pretraining` view counts each encoder once
    however many finetunings share it, and says "none" for a random start."""
    monkeypatch.chdir(tmp_path)
    items = _two_systems(tmp_path)
    items.append(f"P={_run(tmp_path, 'p-seed3', 3, [34.0, 44.0, 54.0, 64.0], C1)}")
    for name, enc, ppl in (("p-seed1", "enc-a", 270.0), ("p-seed2", "enc-a", 270.0), ("p-seed3", "enc-b", 280.0)):
        (tmp_path / "runs" / name / "init").mkdir()
        (tmp_path / "runs" / name / "init" / "export.json").write_text(json.dumps(
            {"mlflow_run_id": enc, "stage": "in-domain", "init": "models:/hibert-encoder@open-domain", "step": 429,
             "git_commit": C2, "final_metrics": {"valid_ppl": ppl, "valid_loss": 5.6, "note": "text"}}))
    out = tmp_path / "enc.json"
    assert hibert(["compare", *items, "--bootstrap", "50", "--results", str(out)]) == 0
    res = json.loads(out.read_text())
    assert "encoder" not in res["systems"]["R"]["runs"][0]
    assert res["systems"]["P"]["runs"][0]["encoder"] == {
        "run": "enc-a", "stage": "in-domain", "init": "models:/hibert-encoder@open-domain", "step": 429,
        "model_commit": C2, "last_valid": {"valid_ppl": 270.0, "valid_loss": 5.6}}
    lines = _tables().pretraining(res)[0]
    assert lines[0] == ("| system | encoders | stage | continued from | steps | ppl (valid, last step) | "
                        "minutes (this stage) | pretrained at |")
    assert lines[2] == "| R | none (random init) |  |  |  |  |  |  |"
    assert lines[3] == (f"| P | 2 | in-domain | models:/hibert-encoder@open-domain | 429 | 275 ± 7 (270 / 280) |  | "
                        f"{C2[:7]} |")
    # encoders without an MLflow run are told apart by what their exports say; a metric not every encoder has
    # leaves the cell empty
    p_runs = res["systems"]["P"]["runs"]
    p_runs[0]["encoder"] |= {"run": None, "last_valid": {"valid_loss": 5.6}}
    p_runs[1]["encoder"] |= {"run": None, "last_valid": {"valid_loss": 5.7}}
    assert _tables().pretraining(res)[0][3].startswith("| P | 3 | in-domain | models:/hibert-encoder@open-domain | 429 | "
                                                      "5.63 ± 0.06 (5.60 / 5.70 / 5.60) (loss) |")
    p_runs[2]["encoder"]["last_valid"] = {}
    assert "| 429 |  |  |" in _tables().pretraining(res)[0][3]


def test_a_runs_training_time_is_its_mlflow_runs_and_a_missing_store_is_not_created(tmp_path, monkeypatch):
    """`run_seconds`: the MLflow run's end less its start, from the store the run's config names (the default
    sqlite file under run.output_dir); None, with nothing written, where that store does not exist."""
    from mlflow.tracking import MlflowClient

    from hibert.finetune.results_file import run_seconds

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "out" / "ft"
    run_dir.mkdir(parents=True)
    (run_dir / "config.resolved.yaml").write_text(yaml.safe_dump(
        {"run": {"output_dir": str(tmp_path / "out")}, "tracking": {"uri": None}}))
    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("x"), start_time=1_000_000)
    client.set_terminated(run.info.run_id, end_time=1_000_000 + 95_500)
    assert run_seconds(run_dir, run.info.run_id) == 95.5
    # a relative output_dir (as recipes write it) is the run directory's parent, wherever compare runs from
    (run_dir / "config.resolved.yaml").write_text(yaml.safe_dump(
        {"run": {"output_dir": "runs/x", "name": "ft"}, "tracking": {"uri": None}}))
    assert run_seconds(run_dir, run.info.run_id) == 95.5
    assert run_seconds(run_dir, "no-such-run") is None and run_seconds(run_dir, None) is None
    (run_dir / "config.resolved.yaml").write_text(yaml.safe_dump(
        {"run": {"output_dir": str(tmp_path / "elsewhere")}, "tracking": {"uri": None}}))
    assert run_seconds(run_dir, run.info.run_id) is None and not (tmp_path / "elsewhere").exists()
    # a tracking server that does not answer: no time, at once, and no error
    (run_dir / "config.resolved.yaml").write_text(yaml.safe_dump(
        {"run": {"output_dir": str(tmp_path / "out")}, "tracking": {"uri": "http://127.0.0.1:9"}}))
    assert run_seconds(run_dir, run.info.run_id) is None


def test_a_models_commit_comes_from_the_report_or_the_export_it_evaluated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path, "a", 1, [1.0] * 4, C1)
    run = tmp_path / "runs" / "a"
    report = run / "report-test" / "report.json"
    assert model_commit(report, run) == C1                     # meta.model: the export directory evaluated
    data = json.loads(report.read_text())
    data["meta"]["model"] = "models:/hibert-extractive@finetuned"
    report.write_text(json.dumps(data))
    assert model_commit(report, run) == C1                     # the run's own export is that MLflow run
    data["meta"]["finetune_run"] = "another-run"
    report.write_text(json.dumps(data))
    assert model_commit(report, run) == "unknown"              # the run's export is not what was evaluated
    data["meta"]["git_commit"] = C2
    report.write_text(json.dumps(data))
    assert model_commit(report, run) == C2                     # the report's own provenance first


def test_benchmark_views_and_bad_blocks(tmp_path, monkeypatch, capsys):
    tables = _tables()
    view = tables.BenchView(corner="size", rows=(("small", 0, "results.small"), ("big", 1, "results.big")),
                            columns=(("ms", "ms", lambda x: f"{x:.1f}"), ("runs", "n", str)),
                            script="benchmarks/bench_x.py", command=("size", "profile", "skip"))
    monkeypatch.setitem(tables.BENCH_VIEWS, "toy", view)
    bench = tmp_path / "benchmarks" / "results"
    bench.mkdir(parents=True)
    (bench / "a.json").write_text(json.dumps({"machine": {"commit": C1, "tracked_changes": False},
                                              "args": {"size": "small", "profile": "True", "skip": "False"},
                                              "results": {"small": {"ms": 1.26, "n": 3}}}))
    (bench / "b.json").write_text(json.dumps({"machine": {}, "results": {"big": {"ms": 20.04, "n": 1}}}))
    block = tables.render_block(tmp_path, "benchmarks/results/a.json+benchmarks/results/b.json", "toy")
    assert block.splitlines()[:4] == ["| size | ms | runs |", "|---|---|---|", "| small | 1.3 | 3 |",
                                      "| big | 20.0 | 1 |"]
    assert (f"Made at commit {C1[:7]} by `python benchmarks/bench_x.py --size small --profile` "
            "(benchmarks/results/a.json).") in block
    assert ("Generated from benchmarks/results/b.json, which does not record the commit and the command that made "
            "it") in block
    for source, view, match in (("benchmarks/results/a.json", "nope", "no view 'nope'"),
                                ("benchmarks/results/gone.json", "toy", "cannot read it"),
                                ("benchmarks/results/a.json", "paired", "reads one hibert-results/1 file")):
        with pytest.raises(tables.TableError, match=match):
            tables.render_block(tmp_path, source, view)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("<!-- table: benchmarks/results/gone.json toy -->\n<!-- /table -->\n")
    assert tables.main(["--check"], root=tmp_path) == 2 and "docs/x.md: benchmarks/results/gone.json" in \
        capsys.readouterr().err


def test_benchmark_rows_join_objects_select_list_elements_and_derive_cells(tmp_path):
    """A row of two paths reads both objects (the CPU profile's batch 1 and 16 and their ratio); `key=value&...`
    picks a list's element by its fields; list-valued arguments show as the script takes them."""
    tables = _tables()
    bench = tmp_path / "benchmarks" / "results"
    bench.mkdir(parents=True)
    ops = {key: 10.0 for _, key in tables.PROFILE_ROWS}
    args = {"device": "cpu", "dtype": "fp32", "size": "small", "batch": "16", "cross": "['flat', 'pht']",
            "profile": "True", "skip": "throughput,cache,memory"}
    (bench / "p.json").write_text(json.dumps({"machine": {"commit": C1}, "args": args, "results": {"profile": {
        "batch1": {**ops, "encoder pass": 54.4}, "batch16": {**ops, "encoder pass": 46.3}}}}))
    block = tables.render_block(tmp_path, "benchmarks/results/p.json", "generate-cpu-profile").splitlines()
    assert block[0] == "|  | batch 1 | batch 16 | shared |"
    assert "| encoder pass | 54 | 46 | 1.2× |" in block and "| wall, profiler off | 10 | 10 | 1.0× |" in block
    assert block[-1] == (f"Made at commit {C1[:7]} by `python benchmarks/bench_generate.py --device cpu --dtype fp32 "
                         "--size small --batch 16 --cross flat,pht --profile --skip throughput,cache,memory` "
                         "(benchmarks/results/p.json).")

    rows = {"rows": [{"stage": "make_item", "x": 1}, {"stage": "loader w=1", "zero": 2, "x": 2},
                     {"stage": "loader w=1", "zero": 3, "x": 3}]}
    assert tables.lookup(rows, "rows.stage=loader w=1.x") == 2            # the first that matches
    assert tables.lookup(rows, "rows.stage=loader w=1&zero=3.x") == 3
    assert tables.pick(rows, ("rows.0.x", "rows.stage=loader w=1&zero=3.x")) == (1, 3)
    with pytest.raises(KeyError):
        tables.lookup(rows, "rows.stage=loader w=9")
    loader = {"args": {"dataset": "/tmp/news", "workers": [0, 1, 2], "repeats": 3, "pin": False},
              "rows": [{"stage": s, "ms_per_batch": 6.94, "tokens_per_s": 5.68e6, "x_gpu_target": 4.148}
                       for s in ("make_item", "per-document ref", "loader w=1", "loader w=2")]}
    (bench / "l.json").write_text(json.dumps(loader))
    block = tables.render_block(tmp_path, "benchmarks/results/l.json", "loader").splitlines()
    assert block[4] == "| DataLoader, 1 worker (make_item + hand-over) | 6.9 | 5.7M | 4.1 |"
    assert block[-1] == ("Made by `python benchmarks/bench_loader.py --dataset /tmp/news --workers 0 1 2 --repeats 3` "
                         "(benchmarks/results/l.json, which does not record the commit it ran at: "
                         "`bash benchmarks/rerun_cpu.sh` remakes it at one).")
    # bench_generate's ratios: those the run measured, each with its rounds' range and its target
    gen = {"machine": {"commit": C1, "tracked_changes": False,
                       "command": "python benchmarks/bench_generate.py --skip memory --out x.json"},
           "ratios": {"batch_speedup": {"value": 3.2, "rounds": [3.0, 3.4, 3.2], "target": ">= 3.0", "met": True},
                      "vht_time_ratio": {"value": 2.5, "rounds": [2.5]}}}
    (bench / "g.json").write_text(json.dumps(gen))
    block = tables.render_block(tmp_path, "benchmarks/results/g.json", "generate-ratios").splitlines()
    assert block[2] == "| batch 16 over one document at a time (summary tokens/s) | 3.20× | 3.00–3.40 | >= 3.0 (met) |"
    assert block[3] == "| VHT cross-attention over flat (time) | 2.50× |  |  |" and block[4] == ""
    assert block[-1] == (f"Made at commit {C1[:7]} by `python benchmarks/bench_generate.py --skip memory --out x.json` "
                         "(benchmarks/results/g.json).")   # the command as it ran wins over one rebuilt from args
    # bench_mds: each encoder's step time and peak memory per length, and the fitted growth
    rows = {f"{k}@{n}": {"seconds": n / 1000, "peak_mib": n / 10} for k in ("hierarchical", "hibert-flat", "token-flat")
            for n in (800, 1600)}
    growth = {k: {"time": 1.0, "memory": 0.5} for k in ("hierarchical", "hibert-flat", "token-flat")}
    (bench / "m.json").write_text(json.dumps({"lengths": [800, 1600], "rows": rows, "growth_exponent": growth}))
    block = tables.render_block(tmp_path, "benchmarks/results/m.json", "mds-growth").splitlines()
    assert block[0] == ("| encoder | step @ 800 | step @ 1,600 | time grows | peak @ 800 | peak @ 1,600 | "
                        "memory grows |")
    assert block[2] == ("| hierarchical (HIBERT per unit + global layers) | 0.80 s | 1.60 s | n^1.00 | 80 MiB | 160 MiB "
                        "| n^0.50 |")
    # project_scaling's rates: one where nothing overlaps, the compute's share where communication takes any
    assert tables.overlap_rates((6.35e6, 0.98, 6.35e6, 0.98)) == "6.35M (98%)"
    assert tables.overlap_rates((20.1e6, 0.776, 25.9e6, 1.0)) == "20.1M (78%) / 25.9M"
    assert [tables.millions(x) for x in (809449, 33.02e6, 158.4e6)] == ["0.809M", "33.0M", "158M"]


def test_the_positions_of_each_systems_picks_are_summed_over_its_seeds(tmp_path):
    """`picked_positions`: a system's report.json `positions` summed over its seeds' reports (its own row of each);
    the `positions` view: % of its picks at each sentence position."""
    from hibert.finetune.results_file import picked_positions

    runs = []
    for i, counts in enumerate(([2, 1, 0, 1], [1, 1, 1, 1])):
        report = tmp_path / f"r{i}.json"
        report.write_text(json.dumps({"positions": {"bins": ["1", "2", "3", "4+"], "systems": {
            "model": {"picks": sum(counts), "counts": counts}, "lead3": {"picks": 3, "counts": [1, 1, 1, 0]}}}}))
        runs.append({"report": str(report), "row": "model"})
    assert picked_positions(runs) == {"bins": ["1", "2", "3", "4+"], "picks": 8, "counts": [3, 2, 1, 2]}
    assert picked_positions([*runs, {"report": str(tmp_path / "none.json"), "row": "model"}]) is None
    lines, _ = _tables().positions({"systems": {"pre": {"positions": picked_positions(runs)}, "lead3": {}}})
    assert lines[0] == "| system | picks | sentence 1 | sentence 2 | sentence 3 | sentence 4+ |"
    assert lines[2] == "| pre | 8 | 38 | 25 | 12 | 25 |" and len(lines) == 3


def test_prep_projection_adds_the_neural_segmenters_cost_to_prep(tmp_path):
    """GIGA-CM (2,854M words) from prep at the largest corpus (200,000 words/s/core, spaCy variant) and the
    segmenters alone (400,000 and 10,000): with the neural one a word costs 1/200k - 1/400k + 1/10k s = 1/9,756 s;
    core-hours 2,854e6 / rate / 3600 = 3.96 and 81.3; over 32 and 512 cores 7.4 / 0.5 min and 2.5 h / 9.5 min."""
    tables = _tables()
    bench = tmp_path / "benchmarks" / "results"
    bench.mkdir(parents=True)
    prep = {size: {"prep": [{"words": words, "words_per_s_per_core": rate}]}
            for size, words, rate in (("10MB", 1e6, 150_000.0), ("1GB", 1e8, 200_000.0))}
    (bench / "scale.json").write_text(json.dumps({"machine": {}, "sizes": prep}))
    (bench / "seg.json").write_text(json.dumps({"machine": {}, "rows": {
        "spacy variant (default)": {"words_per_s_per_core": 400_000.0}, "neural (CPU)": {"words_per_s_per_core": 10_000.0}}}))
    block = tables.render_block(tmp_path, "benchmarks/results/scale.json+benchmarks/results/seg.json",
                                "prep-projection").splitlines()
    assert block[2:4] == ["| spacy variant (default) | 200,000 | 4.0 | 7.4 min | 0.5 min |",
                          "| neural (CPU) | 9,756 | 81.3 | 2.5 h | 9.5 min |"]
