"""`hibert compare` on hand-made reports: pairing by document id, the reference's sign, another row of a
report (`#lead3`), and the errors."""
import json

import pytest

from hibert.errors import UserError
from hibert.finetune.compare import compare
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
    assert "| b-a | 2 | +2.00" in capsys.readouterr().out
    assert json.loads((tmp_path / "t.json").read_text())["paired"]["b-a"]["rougeL_f"]["diff"] == pytest.approx(2.0)
    with pytest.raises(UserError, match="no per-document scores for 'oracle'"):
        compare([str(a), f"{b}#oracle"], "test", 10)
    with pytest.raises(UserError, match="no report.json"):
        compare([str(a), str(tmp_path / "nowhere")], "test", 10)
    c = _report(tmp_path / "c", ["x"], [1.0])
    with pytest.raises(UserError, match="shares no documents"):
        compare([str(a), str(c)], "test", 10)
