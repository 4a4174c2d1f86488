"""The cnndm-40k experiment's data: no validation or test article of the finetuning dataset enters any
pretraining stage — by the recipes' sources, by the content hashes of prepared datasets (data_prep/overlap.py),
and in every committed pretraining unit's record."""
import json
from pathlib import Path

import pytest

from conftest import REPO
from hibert.config import load_config
from hibert.config.data import DataConfig, SourceConfig, TokenizerConfig
from hibert.data_prep import prepare
from hibert.data_prep.overlap import main as overlap_main
from hibert.slurm.stages import find_recipe

HELD_OUT = ("cnndm40k_val", "cnndm40k_test")


def _stage_data(recipe: str, command: str) -> list[DataConfig]:
    cfg = load_config(find_recipe(recipe), [])
    return [load_config(find_recipe(recipe), list(st.overrides)).data for st in cfg.slurm.pipeline
            if st.command == command]


def test_no_pretraining_stage_reads_a_held_out_file_and_finetuning_validates_and_tests_on_them():
    pretraining = _stage_data("cnndm-40k", "pretrain")
    assert len(pretraining) == 3   # open-domain, in-domain after it, in-domain alone
    for data in pretraining:
        assert not [s.path for s in data.sources if any(h in s.path for h in HELD_OUT)], data.sources
    ft = load_config(find_recipe("cnndm-40k-finetune"), []).data
    by_split = {s.split: Path(s.path).name for s in ft.sources}
    assert by_split == {"train": "cnndm40k_train.jsonl.gz", "valid": "cnndm40k_val.jsonl.gz",
                        "test": "cnndm40k_test.jsonl.gz"}


def _rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_hash_check_finds_a_held_out_article_in_a_pretraining_dataset(tmp_path, tiny_data, capsys):
    tok = TokenizerConfig(model=str(tiny_data["open"] / "tokenizer.model"))
    art = [{"idx": i, "article": f"story {i} starts here . the council met on day {i} .", "highlights": f"day {i}"}
           for i in range(9)]
    files = {n: _rows(tmp_path / f"{n}.jsonl", art[k:k + 3]) for n, k in (("train", 0), ("val", 3), ("test", 6))}
    common = dict(format="jsonl", text_field="article", id_field="idx", ptb_tokenized=True)
    ft = DataConfig(output=str(tmp_path / "ft"), tokenizer=tok, sources=[
        SourceConfig(path=files[s], name=s, summary_field="highlights", split=split, **common)
        for s, split in (("train", "train"), ("val", "valid"), ("test", "test"))])
    prepare(ft, progress=False)
    clean = DataConfig(output=str(tmp_path / "pre"), tokenizer=tok, valid_fraction=0.0, test_fraction=0.0,
                       sources=[SourceConfig(path=files["train"], name="pre", **common)])
    prepare(clean, progress=False)
    assert overlap_main([str(tmp_path / "pre"), "--against", str(tmp_path / "ft")]) == 0
    leaky = clean.model_copy(update={"output": str(tmp_path / "leak"), "sources": [
        *clean.sources, SourceConfig(path=_rows(tmp_path / "one.jsonl", art[7:8]), name="x", **common)]})
    prepare(leaky, progress=False)
    assert overlap_main([str(tmp_path / "leak"), "--against", str(tmp_path / "ft")]) == 1
    assert "1 shared with the 6" in capsys.readouterr().out


@pytest.mark.parametrize("record", sorted((REPO / "docs" / "results").glob("cnndm40k-pretrain-*.json")),
                         ids=lambda p: p.stem)
def test_every_committed_pretraining_unit_checked_its_data_against_the_held_out_articles(record):
    rec = json.loads(record.read_text())
    overlap = rec["overlap"]
    assert overlap["splits"] == ["valid", "test"] and overlap["held_out_documents"] == 4332 + 2845
    assert [r["shared"] for r in overlap["pretraining"]] == [0] * len(rec["stages"])
