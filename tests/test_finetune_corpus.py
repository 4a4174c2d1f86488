"""Corpus mode of `hibert summarize --output` without a model: the stream, part files, resume, merge and the
checks made before any work, driven in-process with a stand-in `summarize_all` (finetune/inference/corpus.py,
finetune/corpus_cli.py). End-to-end runs with a trained model: tests/test_finetune_e2e.py."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hibert.errors import UserError
from hibert.finetune.inference.corpus import (
    check_unlocked,
    done_path,
    export_digest,
    lock_part,
    merge,
    part_path,
    read_stats,
    settings_fingerprint,
    settings_path,
    stats_path,
    summarize_shard,
)
from hibert.finetune.inference.source import Shard, Source
from hibert.finetune.inference.text import Summary
from hibert.finetune.settings import SummarizeSettings

pytestmark = pytest.mark.timeout(60)


def first_words(docs: list) -> list[Summary]:
    return [Summary(doc_id, [" ".join(text.split()[:2])], [0], 1, "") for doc_id, text in docs]


def corpus(path: Path, n: int = 6) -> Path:
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"w{i} alpha beta"}) + "\n" for i in range(n)))
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def cli(tmp_path: Path, capsys, **kw) -> tuple[int, str, str]:
    """`run_summarize_corpus` with a model that does not exist: whatever is checked before the model shows."""
    from hibert.finetune.corpus_cli import run_summarize_corpus

    args = argparse.Namespace(**{
        "input": None, "output": None, "limit": None, "shard": None, "merge": False, "shards": None, "nproc": 1,
        "model": str(tmp_path / "no-model"), "field": "text", "id_field": None, "split": None, "window": 4,
        "no_progress": True, **kw})
    cfg = SimpleNamespace(run_dir=tmp_path / "run", run=SimpleNamespace(output_dir=tmp_path),
                          tracking=SimpleNamespace(uri=None))
    code = run_summarize_corpus(cfg, args, SummarizeSettings())
    out = capsys.readouterr()
    return code, out.err, out.out


# ------------------------------------------------------------------------------------------ bad input lines
def test_lines_json_cannot_hold_are_skipped_and_counted(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        json.dumps({"id": "a", "text": "one two three"}),
        "[" * 100_000,                                        # RecursionError in json.loads
        '{"id": ' + "9" * 5000 + ', "text": "x y"}',          # past Python's integer digit limit
        '{"id": "\\ud800", "text": "x y"}',                   # a lone surrogate: no UTF-8 line can hold it
        '{"id": "s", "text": "bad \\udfff text"}',
        json.dumps({"id": "b", "text": "four five six"})]) + "\n")
    out = tmp_path / "out.jsonl"
    result = summarize_shard(first_words, Source(src), out, Shard(0, 1))
    assert result.summarized == 2 and dict(result.skipped) == {"invalid JSON": 2, "invalid text": 2}
    merge(out, 1, "in.jsonl")
    recs = lines(out)
    assert [r.get("reason") for r in recs] == [None, "invalid JSON", "invalid JSON", "invalid text", "invalid text",
                                              None]
    assert "nested too deeply" in recs[1]["skipped"] and recs[3]["id"] == "in.jsonl:4"


def test_a_damaged_part_line_is_named_as_such(tmp_path):
    src, out = corpus(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    part_path(out, Shard(0, 1)).write_text('{"index": 0, "id": "d0"}\n{"no index": 1}\n')
    with pytest.raises(UserError, match="out.jsonl.part-00000-of-00001: holds a line this command did not write"):
        summarize_shard(first_words, Source(src), out, Shard(0, 1))


# ------------------------------------------------------------------------------------- checks before work
def test_output_that_is_the_input_or_a_directory_is_refused_before_any_work(tmp_path, capsys):
    src = corpus(tmp_path / "in.jsonl")
    before = src.read_bytes()
    code, err, _ = cli(tmp_path, capsys, input=[str(src)], output=str(tmp_path / "." / "in.jsonl"))
    assert code == 2 and "is the --input" in err and src.read_bytes() == before
    (tmp_path / "outdir").mkdir()
    code, err, _ = cli(tmp_path, capsys, input=[str(src)], output=str(tmp_path / "outdir"))
    assert code == 2 and "a directory; name a file in it" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "outdir"]


def test_input_problems_are_not_blamed_on_the_model(tmp_path, capsys):
    out = str(tmp_path / "o.jsonl")
    code, err, _ = cli(tmp_path, capsys, input=[str(tmp_path / "nope.jsonl")], output=out)
    assert code == 2 and "--input" in err and "no such file" in err and "cannot load model" not in err
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    code, err, _ = cli(tmp_path, capsys, input=[str(ds)], output=out, split="nosuch")
    assert code == 2 and "no split 'nosuch' (splits: train, test)" in err and "cannot load model" not in err
    pretty = tmp_path / "pretty.json"   # every line of it would be skipped one by one
    pretty.write_text(json.dumps([{"id": "a", "text": "one two"}], indent=1))
    code, err, _ = cli(tmp_path, capsys, input=[str(pretty)], output=out)
    assert code == 2 and "pretty-printed JSON, not JSON lines" in err and "cannot load model" not in err
    code, err, _ = cli(tmp_path, capsys, input=[str(corpus(tmp_path / "in.jsonl"))], output=out)
    assert code == 2 and "cannot load model" in err   # the input is fine: now the model is named


def test_a_damaged_saved_dataset_is_an_input_error(tmp_path, capsys):
    from datasets import Dataset

    Dataset.from_list([{"id": "a", "text": "one two"}]).save_to_disk(str(tmp_path / "ds"))
    for f in (tmp_path / "ds").glob("*.arrow"):
        f.write_text("garbage\n")
    code, err, _ = cli(tmp_path, capsys, input=[str(tmp_path / "ds")], output=str(tmp_path / "o.jsonl"))
    assert code == 2 and "--input" in err and "cannot read the saved dataset" in err
    assert "cannot load model" not in err and "part file" not in err


def test_the_split_is_resolved_once_for_every_process_and_the_stats(tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert Source(ds).name == "ds[test]" and Source(ds).split == "test"   # what is read, before it is opened
    assert Source(ds, split="train").name == "ds[train]"
    (ds / "dataset_dict.json").write_text(json.dumps({"splits": ["validation"]}))
    assert Source(ds).name == "ds[validation]"


# ------------------------------------------------------------------------------ metadata files after crashes
def test_an_unreadable_done_file_is_redone_and_one_merge_counts(tmp_path):
    src, out = corpus(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    for i in range(2):
        summarize_shard(first_words, Source(src), out, Shard(i, 2))
    done = done_path(part_path(out, Shard(0, 2)))
    done.write_text("")                                   # a crash while it was written
    with pytest.raises(UserError, match="1 of 2 shards are not finished"):
        merge(out, 2)
    again = summarize_shard(first_words, Source(src), out, Shard(0, 2))
    assert again.written == 3 and again.summarized == 3 and json.loads(done.read_text())["written"] == 3
    assert merge(out, 2)["records_in"] == 6 and [r["index"] for r in lines(out)] == list(range(6))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_done_file_whose_part_was_removed_is_redone(tmp_path):
    src, out = corpus(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    for i in range(2):
        summarize_shard(first_words, Source(src), out, Shard(i, 2))
    part_path(out, Shard(1, 2)).unlink()                  # removed by hand; its .done stays
    with pytest.raises(UserError, match="1 of 2 shards are not finished"):
        merge(out, 2)
    assert summarize_shard(first_words, Source(src), out, Shard(1, 2)).written == 3
    assert merge(out, 2)["records_in"] == 6 and [r["index"] for r in lines(out)] == list(range(6))


def test_an_unreadable_stats_file_is_redone_not_a_traceback(tmp_path, capsys):
    src, out = corpus(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    summarize_shard(first_words, Source(src), out, Shard(0, 1))
    merge(out, 1)
    assert read_stats(out)["records_in"] == 6
    code, _, said = cli(tmp_path, capsys, input=[str(src)], output=str(out))
    assert code == 0 and said.startswith("already complete: 6 records in")
    stats_path(out).write_text("")
    assert read_stats(out) is None
    code, err, _ = cli(tmp_path, capsys, input=[str(src)], output=str(out))
    assert code == 2 and "cannot be read" in err and "cannot load model" in err   # redone: here, no model


# ------------------------------------------------------------------------------------ one run per part file
def test_a_part_another_process_writes_is_refused(tmp_path):
    src, out = corpus(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    part = part_path(out, Shard(0, 2))
    with lock_part(part):
        with pytest.raises(UserError, match="another process is writing it"):
            summarize_shard(first_words, Source(src), out, Shard(0, 2))
        with pytest.raises(UserError, match=r"part-00000-of-00002: another process"):
            check_unlocked(out, 2)
    assert part.read_text() == ""
    check_unlocked(out, 2)   # released with the file
    assert summarize_shard(first_words, Source(src), out, Shard(0, 2)).written == 3


def test_resuming_with_another_shard_count_is_refused(tmp_path, capsys):
    src, out = corpus(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    summarize_shard(first_words, Source(src), out, Shard(0, 2))
    with pytest.raises(UserError, match="split into 2 shards.*--nproc 2"):
        summarize_shard(first_words, Source(src), out, Shard(0, 1))
    with pytest.raises(UserError, match="split into 2 shards"):
        merge(out, 3)
    code, err, _ = cli(tmp_path, capsys, input=[str(src)], output=str(out), nproc=3)
    assert code == 2 and "resume it with --nproc 2" in err


def test_resuming_with_another_model_or_flags_is_refused(tmp_path):
    src, out = corpus(tmp_path / "in.jsonl", 8), tmp_path / "out.jsonl"
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"a" * 100)
    fp = {"model": export_digest(model), "model_ref": str(model), "settings": {"model_settings": {"beam_size": 4}}}

    def dies_after_one_window(docs: list) -> list[Summary]:
        if calls.append(1) or len(calls) > 1:
            raise RuntimeError("killed")
        return first_words(docs)

    calls: list[int] = []
    with pytest.raises(RuntimeError):
        summarize_shard(dies_after_one_window, Source(src), out, Shard(0, 1), window=2, fingerprint=fp)
    assert json.loads(settings_path(out).read_text())["settings"] == {"model_settings": {"beam_size": 4}}
    with pytest.raises(UserError, match=r"other settings \(settings: .*beam.*4.* then, .*beam.*5.* now\)"):
        summarize_shard(first_words, Source(src), out, Shard(0, 1), fingerprint={**fp, "settings": {
            "model_settings": {"beam_size": 5}}})
    (model / "weights.bin").write_bytes(b"b" * 100)
    assert export_digest(model) != fp["model"]
    with pytest.raises(UserError, match="the model: "):
        summarize_shard(first_words, Source(src), out, Shard(0, 1), fingerprint={**fp, "model": export_digest(model)})
    result = summarize_shard(first_words, Source(src), out, Shard(0, 1), window=2, fingerprint=fp)
    assert result.written == 8 and result.resumed_after == 1
    # the batch size is not part of it: a run that ran out of memory resumes with a smaller one
    fingerprint = lambda batch: settings_fingerprint("d", "m", None, None, {"model_settings": {"beam_size": 4,  # noqa: E731
                                                                                        "batch_size": batch}})
    assert fingerprint(32) == fingerprint(4) != settings_fingerprint("d", "m", None, None, {"model_settings": {}})
    merge(out, 1)
    assert not settings_path(out).exists()


# ------------------------------------------------------------------------------- stop signals under --nproc
PARENT = """
import sys
from pathlib import Path
import hibert.finetune.corpus_cli as c
from hibert.finetune.inference.source import Source
d = Path(sys.argv[1])
child = "import os, time; open({!r} + '/pid%d' % {}, 'w').write(str(os.getpid())); time.sleep(120)"
c._child_argv = lambda n, i, local: [sys.executable, "-c", child.format(str(d), i)]
c._devices = lambda n: [None] * n
(d / "in.jsonl").write_text('{"id": "a", "text": "x"}\\n')
sys.exit(c._run_local(2, d, Source(d / "in.jsonl"), d / "out.jsonl", None))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_nproc_parent_stops_its_shard_processes(tmp_path, sig):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], stderr=subprocess.PIPE, text=True)
    pids = [tmp_path / "pid0", tmp_path / "pid1"]
    deadline = time.time() + 30
    while not all(p.is_file() and p.read_text() for p in pids) and time.time() < deadline:
        time.sleep(0.05)
    children = [int(p.read_text()) for p in pids]
    parent.send_signal(sig)
    _, err = parent.communicate(timeout=30)
    if sig == signal.SIGTERM:   # passed on and waited for
        assert parent.returncode == 128 + sig and "stopped by SIGTERM" in err
        assert not any(_alive(pid) for pid in children)
    deadline = time.time() + 10   # SIGKILL cannot be passed on: the children get SIGTERM as the parent dies
    while any(_alive(pid) for pid in children) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in children)


# ------------------------------------------------------------------------------------------- Slurm chains
def _chain(pipeline: list[dict], shards: int):
    from hibert.config.ops import SlurmConfig

    return SlurmConfig.model_validate({"summarize_shards": shards, "pipeline": pipeline})


def test_a_summarize_chain_that_could_only_fail_at_its_end_is_refused_at_plan_time():
    sum_ = {"name": "sum", "command": "summarize", "args": ["--model", "m", "--input", "in.jsonl", "--output", "a"]}
    merge_ = {"name": "sum-merge", "command": "summarize-merge", "args": ["--input", "in.jsonl", "--output=a"]}
    _chain([sum_, merge_], 4)
    _chain([sum_], 1)    # one task merges its own output
    with pytest.raises(ValueError, match="no summarize-merge stage with its --output"):
        _chain([sum_], 4)
    with pytest.raises(ValueError, match="merges --output b, which no summarize stage writes"):
        _chain([sum_, {**merge_, "args": ["--input", "in.jsonl", "-o", "b"]}], 4)


def test_a_finished_output_asked_for_with_other_settings_or_input_is_refused(tmp_path):
    """The stats of a merged output record what it was made with (settings.json's fingerprint) and the input's
    digest: the same again is "already complete", another model, other flags or a changed input is refused
    (it would hide new work behind the old result); stats of older outputs, without them, stay complete."""
    from hibert.finetune.inference.corpus import check_complete

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": str(i), "text": f"a b c {i}"}) + "\n" for i in range(4)))
    fp = settings_fingerprint("d1", "m", "text", None, {"model_settings": {"beam_size": 4}})
    summarize_shard(first_words, Source(src), out, Shard(0, 1), fingerprint=fp)
    stats = merge(out, 1, src.name, export_digest(src))
    assert stats["settings"]["model"] == "d1" and stats["input_digest"] == export_digest(src)
    check_complete(stats, fp, export_digest(src), out)                                   # the same: complete
    with pytest.raises(UserError, match=r"settings: .*beam_size.: 4.* then, .*beam_size.: 5.* now"):
        check_complete(stats, settings_fingerprint("d1", "m", "text", None, {"model_settings": {"beam_size": 5}}),
                       export_digest(src), out)
    with pytest.raises(UserError, match='the model: "m" then'):
        check_complete(stats, {**fp, "model": "d2"}, export_digest(src), out)
    with open(src, "a") as f:
        f.write(json.dumps({"id": "4", "text": "appended"}) + "\n")
    with pytest.raises(UserError, match="the input: its content changed"):
        check_complete(stats, fp, export_digest(src), out)
    check_complete({k: v for k, v in stats.items() if k != "settings"}, fp, export_digest(src), out)  # older stats


# ------------------------------------------------------------------- targets that cannot be written, stops
def test_an_output_in_a_directory_it_cannot_write_is_one_line_before_the_model(tmp_path, read_only_dir, capsys):
    src = corpus(tmp_path / "in.jsonl")
    for out in (read_only_dir / "o.jsonl", read_only_dir / "sub" / "o.jsonl"):
        code, err, _ = cli(tmp_path, capsys, input=[str(src)], output=str(out))
        assert code == 2 and err.count("\n") == 1, err
        assert f"--output's directory {out.parent} is not writable" in err and "cannot load model" not in err, err


def test_a_full_disk_names_the_output_not_the_run_directory(tmp_path, small_disk, capsys, monkeypatch):
    """ENOSPC while the part is written (a plain write: no file name in the error): one line naming --output and
    its free space, exit 1; what was written is kept."""
    from hibert.finetune import corpus_cli

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": f"w{i} " + "alpha " * 200}) + "\n" for i in range(400)))
    whole = lambda docs: [Summary(i, [t], [0], 1, "") for i, t in docs]   # ~1.2 kB a line
    monkeypatch.setattr(corpus_cli, "_run", lambda cfg, args, settings, output, done: summarize_shard(
        whole, Source(src), output, Shard(0, 1), 4) and 0)
    small_disk.resize("64k")
    out = small_disk.path / "o.jsonl"
    code, err, _ = cli(tmp_path, capsys, input=[str(src)], output=str(out))
    assert code == 1 and err.count("\n") == 1, err
    assert f"no space left on device writing --output {out}" in err and "runs/hibert" not in err, err
    assert part_path(out, Shard(0, 1)).stat().st_size > 0


STOPPED = """
import sys, time, argparse
from pathlib import Path
import hibert.finetune.corpus_cli as c
from hibert.finetune.inference.corpus import summarize_shard
from hibert.finetune.inference.source import Shard, Source
from hibert.finetune.inference.text import Summary
from hibert.finetune.settings import SummarizeSettings
d = Path(sys.argv[1])
def slow(docs):
    time.sleep(0.1)
    return [Summary(i, [t.split()[0]], [0], 1, "") for i, t in docs]
c._run = lambda cfg, args, settings, output, done: summarize_shard(slow, Source(d / "in.jsonl"), output, Shard(0, 1), 1) and 0
args = argparse.Namespace(input=[str(d / "in.jsonl")], output=str(d / "out.jsonl"), limit=None, shard=None, merge=False,
                          shards=None, nproc=1)
sys.exit(c.run_summarize_corpus(None, args, SummarizeSettings()))
"""


def test_a_stopped_corpus_run_says_what_is_kept_and_that_a_rerun_resumes(tmp_path):
    corpus(tmp_path / "in.jsonl", 200)
    proc = subprocess.Popen([sys.executable, "-c", STOPPED, str(tmp_path)], stderr=subprocess.PIPE, text=True)
    part = part_path(tmp_path / "out.jsonl", Shard(0, 1))
    deadline = time.time() + 30
    while not (part.is_file() and part.read_bytes().count(b"\n") >= 2) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    kept = part.read_bytes().count(b"\n")
    assert proc.returncode == 128 + signal.SIGTERM and err.count("\n") == 1, err
    assert f"stopped by SIGTERM: {kept} summaries written so far are kept in {part}; rerun the same command to " \
           "resume" in err, err
