"""Extractive selection, baselines, ROUGE wrapper and bootstrap CIs on hand-checked cases."""
import json
import re

import numpy as np
import pytest
from rouge_score import rouge_scorer

from hibert.finetune.evaluation.rouge import Rouge, bootstrap_ci, paired_bootstrap, summarize_scores
from hibert.finetune.base.selection import lead, oracle_from_labels, select


def test_selection_top_k_in_document_order():
    sents = ["a b c", "d e f", "g h i", "j k l"]
    assert select([0.1, 0.9, 0.2, 0.8], sents, k=2) == [1, 3]
    assert select([0.9, 0.1, 0.95, 0.0], sents, k=2) == [0, 2]
    assert select([0.5, 0.5, 0.5, 0.5], sents, k=3) == [0, 1, 2]  # ties keep earlier sentences
    assert select([0.5, 0.4], ["one", "two"], k=5) == [0, 1]       # a short document gives what it has


def test_trigram_blocking_skips_redundant_sentence():
    sents = ["the cat sat on the mat", "the cat sat on a chair", "dogs bark loudly at night"]
    scores = [0.9, 0.8, 0.1]
    assert select(scores, sents, k=2) == [0, 1]
    assert select(scores, sents, k=2, trigram_blocking=True) == [0, 2]


def test_lead_and_oracle():
    assert lead(["s1", "", "s3", "s4", "s5"], 3) == [0, 2, 3]
    assert lead(["only"], 3) == [0]
    assert oracle_from_labels(np.array([0, 1, 0, 1])) == [1, 3]


def test_rouge_wrapper_equals_rouge_score():
    pred = ["the cat was on the mat", "it was happy"]
    ref = ["the cat sat on the mat", "the cat was happy"]
    ours = Rouge().score_doc(pred, [ref])
    direct = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True).score(
        "\n".join(ref), "\n".join(pred))
    for m in ["rouge1", "rouge2", "rougeL", "rougeLsum"]:
        assert ours[f"{m}_f"] == pytest.approx(100 * direct[m].fmeasure)
        assert ours[f"{m}_p"] == pytest.approx(100 * direct[m].precision)
        assert ours[f"{m}_r"] == pytest.approx(100 * direct[m].recall)


def test_multiple_references_take_the_best():
    r = Rouge()
    pred = ["the cat sat"]
    good, bad = ["the cat sat"], ["a dog ran"]
    assert r.score_doc(pred, [bad, good])["rouge1_f"] == pytest.approx(100.0)
    assert r.score_doc(pred, [bad])["rouge1_f"] == pytest.approx(0.0)


def test_rouge_is_rouge_scores_exactly_and_nfkc_is_an_option():
    """Scores equal the rouge-score package's on the same strings ("8½" stays "8"; NFKC would make it "81⁄2", a new
    token "81"). The option `nfkc=True` normalises both sides: a decoder's nmt_nfkc copy ("fi", "21⁄2") of a raw
    reference ("ﬁ", "2½") then matches in full."""
    from rouge_score import rouge_scorer

    ref = ["a storm cost 8½ million dollars .", "the ﬁnal vote is on monday ."]
    pred = ["the storm cost 8 million .", "the final vote was held ."]
    got = Rouge().score_doc(pred, [ref])
    want = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True).score(
        "\n".join(ref), "\n".join(pred))
    for m, s in want.items():
        assert (got[f"{m}_f"], got[f"{m}_p"], got[f"{m}_r"]) == (100 * s.fmeasure, 100 * s.precision, 100 * s.recall)
    assert Rouge(nfkc=True).score_doc(pred, [ref])["rouge1_f"] != got["rouge1_f"]   # "81" where the package has "8"
    decoded, raw = ["The final bill was 21⁄2 million."], [["The ﬁnal bill was 2½ million."]]
    assert Rouge(("rouge1",), nfkc=True).score_doc(decoded, raw)["rouge1_f"] == 100.0
    assert Rouge(("rouge1",)).score_doc(decoded, raw)["rouge1_f"] < 80   # "nal" and "2" where "final" and "21 2"
    assert Rouge(("rouge1",)).score_doc(["The final cost"], [["The final cost"]])["rouge1_f"] == 100.0


def test_bootstrap_ci_contains_mean_and_narrows():
    rng = np.random.default_rng(0)
    small, large = rng.normal(40, 10, 30), rng.normal(40, 10, 3000)
    for v in (small, large):
        lo, hi = bootstrap_ci(v)
        assert lo <= v.mean() <= hi
    assert np.diff(bootstrap_ci(large)) < np.diff(bootstrap_ci(small)) / 3
    s = summarize_scores({"rouge1_f": small})
    assert s["rouge1_f"]["low"] <= s["rouge1_f"]["mean"] <= s["rouge1_f"]["high"]


def test_paired_bootstrap_hand_cases():
    b = np.array([30.0, 50.0, 10.0, 70.0])
    same = paired_bootstrap(b, b)
    assert (same["diff"], same["low"], same["high"], same["p_value"]) == (0.0, 0.0, 0.0, 1.0)
    shifted = paired_bootstrap(b + 2.0, b)   # the same +2 on every document: no doubt at all
    assert shifted["diff"] == pytest.approx(2.0) and shifted["low"] == pytest.approx(2.0)
    assert shifted["p_value"] == 0.0
    with pytest.raises(ValueError, match="same documents"):
        paired_bootstrap(b, b[:3])


def test_paired_bootstrap_sees_what_overlapping_cis_hide():
    # documents differ a lot (wide per-system CIs that overlap), the systems by a small consistent margin
    rng = np.random.default_rng(1)
    base = rng.normal(40, 15, 60)
    better = base + rng.normal(1.0, 0.5, 60)
    lo_a, hi_a = bootstrap_ci(better)
    lo_b, hi_b = bootstrap_ci(base)
    assert lo_a < hi_b                       # unpaired: the intervals overlap
    r = paired_bootstrap(better, base)
    assert 0 < r["low"] <= r["diff"] <= r["high"] and r["p_value"] < 0.01


def test_summarize_inputs_json_lines_any_suffix_empty_records_clusters_and_length(tmp_path):
    """An empty, blank, binary, non-UTF-8 or missing file is one line naming it; JSON Lines by suffix whatever
    its case (.jsonl .JSONL .ndjson .json); an empty record, a cluster record for a single-document model and a
    document above the export's max_doc_chars are one line naming the input."""
    import json

    from hibert.finetune.inference.text import InputError, check_lengths, read_documents

    for data, needle in [(b"", "bad.txt: empty input"), (b" \n\t", "bad.txt: empty input"),
                         (b"\x00\x01\x02binary", "bad.txt: looks like binary data"),
                         (b"\xff\xfe bad", "bad.txt: not UTF-8 text (invalid start byte at byte 0)")]:
        (tmp_path / "bad.txt").write_bytes(data)
        with pytest.raises(InputError, match=re.escape(needle)):
            list(read_documents(str(tmp_path / "bad.txt"), "text"))
    with pytest.raises(InputError, match="is not a file"):
        list(read_documents(str(tmp_path / "missing.txt"), "text"))
    for name in ("a.JSONL", "a.json", "a.ndjson"):
        p = tmp_path / name
        p.write_text(json.dumps({"text": "One sentence."}) + "\n")
        assert list(read_documents(str(p), "text")) == [(f"{name}:1", "One sentence.")]
    cases = [({"text": "  \n "}, "a.jsonl:1: field 'text' is empty"),
             ({"documents": ["x.", "y."]}, "a.jsonl:1: a cluster (a 'documents' list)"),
             ({"body": "x"}, "a.jsonl:1: no text field 'text'")]
    for rec, needle in cases:
        p = tmp_path / "a.jsonl"
        p.write_text(json.dumps(rec) + "\n")
        with pytest.raises(InputError, match=re.escape(needle)):
            list(read_documents(str(p), "text"))
    export = tmp_path / "export"
    export.mkdir()
    (export / "export.json").write_text(json.dumps({"data": {"limits": {"max_doc_chars": 100}}}))
    check_lengths([("doc.txt", "x" * 100)], export, clusters=False)
    with pytest.raises(InputError, match=r"doc.txt: 101 characters, above the 100"):
        check_lengths([("doc.txt", "x" * 101)], export, clusters=False)
    with pytest.raises(InputError, match=r"c.jsonl:1 \(document 2\): 150 characters"):
        check_lengths([("c.jsonl:1", ["short", "y" * 150])], export, clusters=True)


def test_viewer_copied_fragments_novel_words_and_picks_hand_checked():
    """Grusky et al.'s greedy fragments on a hand-checked case (lowercased): 'the storm hit the coast' (5 tokens)
    and 'power lines fell in' (4) are copied; 'and' is a word the source never uses; 'towns .' is a source run
    of only 2 tokens, below MIN_COPY = 3, so it is neither copied nor novel."""
    from hibert.finetune.evaluation.viewer import _picks, copy_segments, novel_bigrams

    source = ["The storm hit the coast on Monday .", "Power lines fell in three towns ."]
    summary = ["the storm hit the coast and power lines fell in towns ."]
    assert copy_segments(summary, source) == [[["the storm hit the coast", "copy"], [" ", ""], ["and", "novel"],
                                               [" ", ""], ["power lines fell in", "copy"], [" towns .", ""]]]
    assert novel_bigrams(summary, source) == ["coast and", "and power", "in towns"]
    assert _picks(["Power lines fell in three towns ."], source) == [1]
    assert _picks(summary, source) is None


def test_viewer_page_embeds_any_text_safely(tmp_path):
    """Text with </script>, <!-- and the page's own placeholders stays data: one </script> per script element, and
    the embedded JSON reads back to the same text."""
    import json as _json

    from hibert.finetune.evaluation.report import Document
    from hibert.finetune.evaluation.viewer import write_viewer

    nasty = "a </script><script>alert(1)</script> <!-- b __DATA__ __TITLE__"
    docs = [Document("d<1>", [nasty, "Second sentence ."], [["ref </script>"]], None)]
    result = {"summaries": {"model": [[nasty]]}, "per_document": {"model": {"rouge1_f": [1.0], "rouge2_f": [0.5],
                                                                             "rougeL_f": [1.0]}}}
    page = write_viewer(tmp_path, result, docs, {"task": "abstractive", "split": "__DATA__"}).read_text()
    assert page.count("</script>") == 2 and "<!-- b" not in page
    data = page.split('<script type="application/json" id="data">', 1)[1].split("</script>", 1)[0]
    back = _json.loads(data)
    assert back["documents"][0]["source"][0] == nasty and back["documents"][0]["id"] == "d<1>"
    assert "<title>Abstractive summaries on __DATA__: 1 documents</title>" in page


def test_summarize_nproc_children_get_the_parents_own_gpus(monkeypatch):
    from hibert.finetune.corpus_cli import _devices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert _devices(3) == ["2", "3", "2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _devices(2) == [None, None]


def test_settings_resolve_once_over_the_export_and_refuse_another_heads_flags(tmp_path):
    """`resolve_settings`: the export's own settings with the flags given on top; a flag of another head's
    settings (--beam for an extractive model) is one line, not silently ignored."""
    from hibert.finetune.inference.flags import SettingError, check_flags, resolve_settings
    from hibert.heads import get_head

    (tmp_path / "extractive.json").write_text('{"top_k": 2, "trigram_blocking": true}')
    head = get_head("extractive")
    assert resolve_settings(head, tmp_path, {}).model_dump() == {"top_k": 2, "trigram_blocking": True}
    assert resolve_settings(head, tmp_path, {"--k": 4}).top_k == 4
    with pytest.raises(SettingError, match=r"--beam: does not apply to an extractive model \(its flags: --k\)"):
        resolve_settings(head, tmp_path, {"--beam": 4})
    with pytest.raises(SettingError, match=r"--k 0: must be >= 1"):
        check_flags({"--k": 0})


def test_a_deeply_nested_json_line_is_one_line_in_print_mode(tmp_path):
    """`hibert summarize --input x.jsonl` (print mode) reads through the one JSON Lines reader: a line nested past
    Python's recursion limit is an input error naming the line, not a RecursionError traceback."""
    from hibert.finetune.inference.text import InputError, read_documents

    src = tmp_path / "deep.jsonl"
    src.write_text(json.dumps({"text": "fine"}) + "\n" + "[" * 100_000 + "\n")
    with pytest.raises(InputError, match=r"deep.jsonl:2: invalid JSON \(nested too deeply\)"):
        list(read_documents(str(src), "text"))


def test_the_demo_offers_to_serve_only_models_that_write(tmp_path):
    """The demo's "serve:" lines: the extractive model, and a decoding model only when its recorded validation
    perplexity says it writes; one that cannot yet is named as not served, with the reason."""
    from pathlib import Path

    from slurm.local import serve_lines

    def export(name: str, task: str, version: str, ppl: float | None = None) -> Path:
        d = tmp_path / name / "export"
        d.mkdir(parents=True)
        (d / "export.json").write_text(json.dumps({"task": task, "metrics": {} if ppl is None else {"valid_ppl": ppl}}))
        (d / "MLmodel").write_text("flavors: {}\n")
        (d / "registry.json").write_text(json.dumps({"version": version}))
        return d

    ext, abs_bad = export("ft", "extractive", "3"), export("abs", "abstractive", "2", ppl=612.0)
    lines = serve_lines([ext, abs_bad], "sqlite:////x/mlflow.db")
    assert len(lines) == 2 and "serve:" in lines[0] and "hibert serve models:/hibert-extractive/3" in lines[0]
    assert lines[1].startswith("  not served:   models:/hibert-abstractive/2: this model's decoder cannot write yet")
    abs_ok = export("abs2", "abstractive", "4", ppl=9.0)
    lines = serve_lines([ext, abs_ok], "sqlite:////x/mlflow.db")
    assert "--port 5001" in lines[0] and "models:/hibert-abstractive/4" in lines[1] and "--port 5002" in lines[1]


def test_the_position_baseline_picks_the_training_oracles_most_frequent_positions():
    """`position`: the k positions the training oracle picked most often, among those a document has, in document
    order (ties to the earlier position): a byline-first corpus whose oracle prefers sentences 2-4 moves it off
    Lead-3."""
    from hibert.finetune.extractive.evaluate import position_picks

    counts = [1, 9, 8, 7, 2]                      # sentence 1 is a byline: the oracle rarely takes it
    assert position_picks(counts, 10, 3) == [1, 2, 3]
    assert position_picks(counts, 3, 3) == [0, 1, 2]  # a short document: all it has
    assert position_picks([4, 0, 4], 5, 2) == [0, 2] and position_picks([], 4, 2) == [0, 1]


def test_tuning_at_export_reads_only_the_first_documents_and_survives_ones_without_summaries(monkeypatch):
    """The export's selection tuning scores the first `tune_documents` validation chunks and builds their
    documents once (never the whole split per grid point); when none of them has a summary it keeps the configured
    selection and says why instead of failing the export."""
    import numpy as np
    import torch

    from hibert.config import Config
    from hibert.finetune.extractive import task as ext

    class Valid:   # 6 one-chunk documents; only the last two have a summary
        split = "valid"

        def __init__(self):
            self.seen = set()

        def __len__(self):
            return 6

        def __getitem__(self, i):
            return [np.array([5, 6])] * 4

        def source_doc(self, i):
            self.seen.add(i)
            return f"d{i}"

        def chunk_index(self, i):
            return 0

        def sentences_text(self, i):
            return [f"sentence {j} of {i} ." for j in range(4)]

        def summary_text(self, i):
            return ["sentence 1 of 5 ."] if i >= 4 else None

        def labels(self, i):
            return None

    valid = Valid()
    monkeypatch.setattr(ext, "DocumentDataset", lambda d, split: valid if split == "valid" else [])
    monkeypatch.setattr(ext, "HibertExtractive", lambda cfg: torch.nn.Linear(1, 1))
    monkeypatch.setattr(ext, "score_documents", lambda model, docs, device: [np.arange(4.0)[::-1] for _ in docs])
    cfg = Config()
    cfg.objective.tune_documents = 3
    task = object.__new__(ext.ExtractiveTask)
    task.cfg, task.model_cfg = cfg, None
    state = torch.nn.Linear(1, 1).state_dict()
    selection, record = task.tuned_selection(state)
    assert selection == {"top_k": 3, "trigram_blocking": False} and record["tuned"] is False
    # chunk 3 is only looked at to find where document 2 ends
    assert "no scored validation document with a summary" in record["reason"] and valid.seen == {0, 1, 2, 3}
    cfg.objective.tune_documents = 6
    selection, record = task.tuned_selection(state)
    assert record["tuned"] and record["documents"] == 6 and selection["top_k"] in range(1, 6)


def test_summarize_inputs_are_read_no_further_than_a_document_may_be_and_gzip_is_streamed(tmp_path):
    """/dev/zero, a 4 GB sparse .txt or a 4 GB line were read whole before the length check (MemoryError): the
    read stops past the model's document limit; gzip JSON Lines (.jsonl.gz) are read line by line."""
    import gzip
    import json
    import resource

    from hibert.finetune.inference.text import InputError, read_clusters, read_documents

    big = tmp_path / "sparse.txt"
    with open(big, "wb") as f:
        f.truncate(4 << 30)                     # 4 GB of NUL bytes, no disk used
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InputError, match="sparse.txt: looks like binary"):
        list(read_documents(str(big), "text", max_chars=1000))
    text = tmp_path / "long.txt"
    text.write_text("word " * 1000)
    with pytest.raises(InputError, match=r"long.txt: over 4,000 bytes, above the 1,000 characters"):
        list(read_documents(str(text), "text", max_chars=1000))
    line = tmp_path / "long.jsonl"
    line.write_text(json.dumps({"text": "ok."}) + "\n" + json.dumps({"text": "w" * 50_000}) + "\n")
    with pytest.raises(InputError, match=r"long.jsonl:2: a line over 12,000 bytes"):
        list(read_documents(str(line), "text", max_chars=1000))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000   # KiB: nothing read whole
    gz = tmp_path / "docs.jsonl.gz"
    gz.write_bytes(gzip.compress(b"".join(json.dumps({"text": f"Doc {i}."}).encode() + b"\n" for i in range(3))))
    assert list(read_documents(str(gz), "text", limit=2)) == [("docs.jsonl.gz:1", "Doc 0."), ("docs.jsonl.gz:2", "Doc 1.")]
    cl = tmp_path / "c.jsonl.gz"
    cl.write_bytes(gzip.compress(json.dumps({"documents": ["A.", "B."]}).encode() + b"\n"))
    assert list(read_clusters([str(cl)], "text")) == [("c.jsonl.gz:1", ["A.", "B."])]
    empty = tmp_path / "e.jsonl.gz"
    empty.write_bytes(gzip.compress(b"\n\n"))
    with pytest.raises(InputError, match="e.jsonl.gz: empty input"):
        list(read_documents(str(empty), "text"))


def test_a_lone_surrogate_in_a_summarize_record_is_one_line_naming_it(tmp_path):
    from hibert.finetune.inference.text import InputError, read_clusters, read_documents

    (tmp_path / "s.jsonl").write_text('{"text": "ok."}\n{"text": "bad \\ud800 text."}\n')
    with pytest.raises(InputError, match=r"s.jsonl:2: field 'text' holds a lone surrogate at character 4"):
        list(read_documents(str(tmp_path / "s.jsonl"), "text"))
    (tmp_path / "c.jsonl").write_text('{"documents": ["fine.", "\\udfff"]}\n')
    with pytest.raises(InputError, match=r"c.jsonl:1: field 'documents' holds a lone surrogate"):
        list(read_clusters([str(tmp_path / "c.jsonl")], "text"))


def test_bad_export_limits_are_one_line_naming_the_file_and_key(tmp_path):
    import json

    from hibert.errors import UserError
    from hibert.finetune.inference.text import TextEncoder, export_limits, max_doc_chars

    path = tmp_path / "export.json"
    for limits, needle in (({"max_doc_chars": "abc"}, "data.limits.max_doc_chars is 'abc'"),
                           ({"max_sentence_tokens": -3}, "data.limits.max_sentence_tokens is '-3'"),
                           ({"max_doc_sentences": 2.5}, "data.limits.max_doc_sentences is '2.5'"),
                           ([1, 2], "data.limits is list")):
        path.write_text(json.dumps({"data": {"limits": limits}}))
        with pytest.raises(UserError, match=re.escape(f"{path}: {needle}")) as e:
            export_limits(tmp_path)
        assert "\n" not in str(e.value)
    path.write_text(json.dumps({"data": {"limits": {"max_doc_chars": "x"}}}))
    with pytest.raises(UserError, match="data.limits.max_doc_chars"):   # not prep's default in its place
        max_doc_chars(tmp_path)
    with pytest.raises(UserError, match=re.escape(f"{path}: data.segmenter.kind is 'bogus'")):
        TextEncoder(tmp_path, {"data": {"segmenter": {"kind": "bogus"}}})
    path.write_text(json.dumps({"data": {"limits": {"max_doc_chars": 500}}}))
    assert export_limits(tmp_path) == {"max_sentence_tokens": 50, "max_doc_sentences": 30, "max_doc_chars": 500}
    path.unlink()
    assert max_doc_chars(tmp_path) == 1_000_000     # no export.json: prep's defaults


def test_a_served_request_is_bounded_in_rows_and_stops_past_the_servers_timeout(monkeypatch):
    """Rows per request were unbounded (a 47 MB body added 200 MB of peak RSS), and a request past MLflow's
    scoring timeout got its 504 while the worker kept computing: too many rows are a 400, and predict stops
    between batches once the deadline has passed."""
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from hibert.finetune.inference.text import Summary
    from hibert.finetune.serving.pyfunc import HibertPyfunc, _max_batch

    calls = []

    class Slow:
        def summarize_all(self, rows, **kw):
            calls.append(len(rows))
            clock[0] += 10.0
            return [Summary(i, ["s."], [0], 1) for i, _ in rows]

    clock = [0.0]
    monkeypatch.setattr("hibert.finetune.serving.pyfunc.time.monotonic", lambda: clock[0])
    model = object.__new__(HibertPyfunc)
    model.clusters, model.max_chars, model.settings, model.head, model.model_note = False, 1000, None, None, None
    model.max_batch_size, model.max_rows, model.timeout_s, model.summarizer = 2, 5, 15.0, Slow()
    with pytest.raises(MlflowException, match="6 rows: this server takes at most 5 per request"):
        model.predict(pd.DataFrame({"text": ["A doc."] * 6}))
    assert calls == []
    with pytest.raises(MlflowException, match="ran past the server.s 15 s .* after 4 of 5 rows"):
        model.predict(pd.DataFrame({"text": ["A doc."] * 5}))
    assert calls == [2, 2]            # the third batch never started
    calls.clear()
    clock[0] = 0.0
    out = model.predict(pd.DataFrame({"text": ["A doc."] * 4}))
    assert len(out) == 4 and calls == [2, 2]
    assert _max_batch(None, "max_rows", 256) == 256


def test_a_capped_validation_scores_only_documents_it_saw_whole():
    """`schedule.eval_batches` draws some chunks of a long document and not others: the validation ROUGE leaves
    such a document out (it used to fail on "2 scores for 4 sentences"), and says what to do when none is whole."""
    from hibert.errors import UserError
    from hibert.finetune.evaluation.report import Document
    from hibert.finetune.extractive.evaluate import rouge_of_selection

    class Chunks:   # chunks 0, 1: document a (2 sentences each); chunk 2: document b
        def source_doc(self, i):
            return "a" if i < 2 else "b"

    a = Document("a", ["the cat sat .", "a dog ran .", "rain fell .", "sun shone ."], [["rain fell ."]], None)
    b = Document("b", ["birds sang .", "trees grew ."], [["birds sang ."]], None)
    half = {0: np.array([0.9, 0.1]), 2: np.array([0.8, 0.2])}   # a's second chunk not drawn
    r = rouge_of_selection(Chunks(), half, 1, False, docs=[a, b])
    assert r["rouge1_f"] == pytest.approx(100.0)                # b alone: it picks its reference
    whole = {**half, 1: np.array([0.0, 0.95])}                   # a whole: it picks "sun shone .", not its reference
    assert rouge_of_selection(Chunks(), whole, 1, False, docs=[a, b])["rouge1_f"] == pytest.approx(50.0)
    with pytest.raises(UserError, match="eval_batches"):
        rouge_of_selection(Chunks(), {0: np.array([0.9, 0.1])}, 1, False, docs=[a, b])


def test_the_extractive_encoder_takes_its_own_lr_scale_and_warmup():
    """finetune.encoder_lr_scale and encoder_warmup_steps reach the extractive model's encoder (they were ignored:
    the extractive task kept the one default group), the head stays at optimizer.lr."""
    from hibert.config import Config
    from hibert.finetune.extractive.task import ExtractiveTask

    cfg = Config()
    cfg.model.hidden, cfg.model.layers, cfg.model.heads, cfg.model.vocab_size = 16, 1, 2, 50
    cfg.finetune.encoder_lr_scale, cfg.finetune.encoder_warmup_steps = 0.0, 7
    task = ExtractiveTask(cfg, cfg.model)
    model = task.build_model()
    groups = {g.name: g for g in task.param_groups(model, cfg) if g.params}
    enc = [g for n, g in groups.items() if n.startswith("encoder.")]
    head = [g for n, g in groups.items() if n.startswith("head.")]
    assert enc and head and all(g.lr_scale == 0.0 and g.warmup_steps == 7 for g in enc)
    assert all(g.lr_scale == 1.0 and g.warmup_steps is None for g in head)
    assert sum(len(g.params) for g in groups.values()) == len(list(model.parameters()))
