"""Abstractive evaluation helpers on hand-checked cases: novel n-grams, repetition, targets, [SEP] splits."""
import numpy as np
import pytest

from hibert.finetune.inference.decoding import decode_batches, split_sentences
from hibert.finetune.abstractive.data import target_ids
from hibert.finetune.abstractive.metrics import abstractiveness, novel_ngram_rate, repetition_rate
from hibert.tokens import SEP_ID


def test_novel_ngrams_by_hand():
    source = ["the cat sat on the mat .", "a dog barked ."]
    # 4 unigrams, one new ("bird"): 25%; bigrams: "the cat" old, "cat sat" old, "sat bird" new -> 1/3
    assert novel_ngram_rate(["the cat sat bird"], source, 1) == pytest.approx(0.25)
    assert novel_ngram_rate(["the cat sat bird"], source, 2) == pytest.approx(1 / 3)
    # an extract of source sentences has no novel n-grams, also across its sentence boundary
    assert novel_ngram_rate(["a dog barked .", "the cat sat on the mat ."], source, 3) == 0.0
    assert novel_ngram_rate(["short"], source, 2) is None


def test_novel_ngrams_split_punctuation_off_and_match_nfkc_forms():
    """'budget.' is 'budget' '.'. Summary tokens: 'the council approved the budget .' (6) and 'three new schools
    in the city will be funded .' (10); novel: will, be, funded -> 3/16. Bigrams: 'budget .' in the first (5),
    'city will', 'will be', 'be funded', 'funded .' in the second (9) -> 5/14. Length stays in words (14)."""
    source = ["The council approved the budget on Monday, officials said.", "It funds three new schools in the city."]
    summary = ["The council approved the budget.", "Three new schools in the city will be funded."]
    stats = abstractiveness([summary], [source])
    assert stats["novel_1gram"] == pytest.approx(100 * 3 / 16) and stats["novel_2gram"] == pytest.approx(100 * 5 / 14)
    assert stats["mean_words"] == 14.0
    # a decoder's nmt_nfkc copy of a source sentence with a ligature, a fraction and a no-break space
    decoded, source = "The final bill was 21⁄2 for the Office.", "The ﬁnal bill was 2½ for the\u00a0Office."
    assert novel_ngram_rate([decoded], [source], 1) == 0.0


def test_repetition_by_hand():
    assert repetition_rate(["a b c a b c"]) == pytest.approx(1 / 4)  # trigrams abc bca cab abc: one repeat
    assert repetition_rate(["a b c", "a b c"]) == pytest.approx(1 / 2)
    assert repetition_rate(["a b"]) is None
    stats = abstractiveness([["x y z"], ["a b c"]], [["a b c"], ["a b c"]])
    assert stats["novel_1gram"] == pytest.approx(50.0) and stats["mean_words"] == 3.0


def test_target_joins_summary_sentences_with_sep_and_cuts():
    summary = [np.array([7, 8]), np.array([9]), np.array([10, 11])]
    assert target_ids(summary, 100).tolist() == [7, 8, SEP_ID, 9, SEP_ID, 10, 11]
    assert target_ids(summary, 4).tolist() == [7, 8, SEP_ID, 9]
    assert split_sentences([7, 8, SEP_ID, 9, SEP_ID, SEP_ID, 10]) == [[7, 8], [9], [10]]


def test_decode_batches_hold_the_batch_size_asked_for_within_a_token_budget():
    """--batch-size N decodes N documents together (a GPU needs hundreds: it was capped at 16), similar lengths
    together, each document once; long documents split a batch by the token budget (at least 32,768 tokens,
    2,048 per document asked for)."""
    rng = np.random.default_rng(0)
    short = rng.integers(50, 900, 300)
    for size in (1, 16, 40, 256):
        batches = decode_batches(short, size)
        assert sorted(np.concatenate(batches).tolist()) == list(range(300))
        assert max(len(b) for b in batches) == size and len(batches) == -(-300 // size)
        assert [int(b[0]) for b in batches] == sorted(int(b[0]) for b in batches)
    long = np.full(100, 3000)
    assert sorted(len(b) for b in decode_batches(long, 16)) == [10] * 10       # 32,768 // 3,000
    assert sorted(len(b) for b in decode_batches(long, 64)) == [14, 43, 43]    # 64 x 2,048 // 3,000


# ---------------------------------------------------------------- decoding flags, before any model loads
def _unloadable_export(root):
    """An abstractive export's settings (generation.json: 8..20 subwords; abstractive.json: a decoder with 64
    target positions) without any weights: whatever gets as far as loading the model fails with 'cannot load
    model', so a flag error shows that the flags were checked first."""
    import json

    from hibert.config.abstractive import GenerationConfig

    export = root / "export"
    export.mkdir()
    (export / "abstractive.json").write_text(json.dumps({"decoder": {"max_positions": 64}, "max_target_tokens": 40}))
    (export / "generation.json").write_text(json.dumps(GenerationConfig(min_length=8, max_length=20).model_dump()))
    return export


@pytest.mark.parametrize("flags, error", [
    (["--min-len", "50", "--max-len", "10"], "--min-len 50 is above --max-len 10"),
    (["--beam", "-3"], "--beam -3: must be >= 1"),
    (["--beam", "300"], "--beam 300: must be <= 256"),
    (["--length-penalty", "nan"], "--length-penalty nan: must be >= 0.0"),
    (["--no-repeat-ngram", "-1"], "--no-repeat-ngram -1: must be >= 0"),
    (["--max-word-pieces", "65"], "--max-word-pieces 65: must be <= 64"),
    (["--batch-size", "0"], "--batch-size 0: must be >= 1"),
    (["--batch-size", "5000"], "--batch-size 5000: must be <= 1024"),
    # against the model's own settings, read from its json files (no weights)
    (["--max-len", "64"], "--max-len 64: the model's decoder has 64 target positions (decoder.max_positions in "
                          "abstractive.json), so at most --max-len 63"),
    (["--min-len", "30"], "--min-len 30 is above the model's maximum length 20 (generation.json)"),
    (["--max-len", "5"], "--max-len 5 is below the model's minimum length 8 (generation.json)"),
])
@pytest.mark.parametrize("command", ["summarize", "evaluate"])
def test_decoding_flags_that_cannot_work_fail_on_one_line_before_the_model_loads(tmp_path, capsys, command, flags,
                                                                                 error):
    from hibert.cli import main

    export = _unloadable_export(tmp_path)
    doc = tmp_path / "doc.txt"
    doc.write_text("The council met on Monday. It approved the budget.")
    common = [command, f"run.output_dir={tmp_path / 'runs'}", f"data.dataset={tmp_path / 'no-dataset'}",
              "--model", str(export)] + (["--input", str(doc)] if command == "summarize" else [])
    assert main([*common, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hibert {command}: {error}") and "\n" not in err, err  # one line; no "cannot load model"


def test_flag_errors_come_before_model_errors_and_good_flags_reach_the_model(tmp_path, capsys):
    from hibert.cli import main

    export = _unloadable_export(tmp_path)
    doc = tmp_path / "doc.txt"
    doc.write_text("The council met on Monday. It approved the budget.")
    base = ["summarize", f"run.output_dir={tmp_path / 'runs'}", "--input", str(doc)]
    # flags that conflict with each other fail even where the model cannot be found at all
    assert main([*base, "--model", str(tmp_path / "missing"), "--min-len", "9", "--max-len", "3"]) == 2
    assert capsys.readouterr().err.strip() == "hibert summarize: --min-len 9 is above --max-len 3: the minimum " \
                                              "summary length cannot exceed the maximum"
    # flags that fit the model's settings (up to max_positions - 1) pass the checks and get to the (failing) load
    assert main([*base, "--model", str(export), "--min-len", "30", "--max-len", "63", "--beam", "256",
                 "--length-penalty", "10", "--no-repeat-ngram", "0", "--batch-size", "1"]) == 2
    err = capsys.readouterr().err
    assert "cannot load model" in err and "is not an encoder export" in err


@pytest.mark.parametrize("damage", ["abstractive.json", "generation.json"])
@pytest.mark.parametrize("command", ["summarize", "evaluate"])
def test_a_damaged_decoder_config_is_one_line_not_a_traceback(tmp_path, capsys, command, damage):
    from hibert.cli import main

    export = _unloadable_export(tmp_path)
    (export / damage).write_text('{"decoder": {"max_positions": "many"}}' if damage == "abstractive.json"
                                 else '{"beam_size": 0}')
    doc = tmp_path / "doc.txt"
    doc.write_text("The council met on Monday. It approved the budget.")
    common = [command, f"run.output_dir={tmp_path / 'runs'}", f"data.dataset={tmp_path / 'no-dataset'}",
              "--model", str(export)] + (["--input", str(doc)] if command == "summarize" else [])
    assert main(common) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hibert {command}: cannot load model") and damage.split(".")[0] in err.lower() \
        or "max_positions" in err or "beam_size" in err, err
    assert "Traceback" not in err and "\n" not in err, err


def test_fluency_note_reads_the_recorded_validation_perplexity(tmp_path):
    import json

    from hibert.finetune.inference.fluency import WRITES_PPL, fluency_note

    def export(metrics, selected=None):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / "export.json").write_text(json.dumps({"metrics": metrics, "selected_metrics": selected or {},
                                                   "final_metrics": {"valid_ppl": 999.0}}))
        return d

    note = fluency_note(export({"valid_ppl": 312.4}))
    assert note and "cannot write yet" in note and "312" in note and "liu-lapata-2019" in note
    assert fluency_note(export({"valid_ppl": WRITES_PPL - 1})) is None
    assert fluency_note(export({})) is None and fluency_note(tmp_path / "missing") is None
    assert fluency_note(export({"valid_ppl": float("nan")})) is None
    # the exported weights' own perplexity counts, not the last evaluation's (final_metrics: 999 above)
    assert fluency_note(export({"valid_ppl": 12.0}, {"300": {"valid_ppl": 12.0}})) is None
    # an average of checkpoints was never evaluated: the best of the averaged ones' decides
    note = fluency_note(export({}, {"200": {"valid_ppl": 80.0}, "300": {"valid_ppl": 61.0}}))
    assert note and "perplexity 61," in note
    assert fluency_note(export({}, {"200": {"valid_ppl": 80.0}, "300": {"valid_ppl": 20.0}})) is None
    assert fluency_note(export({}, {"200": None})) is None  # kept before candidates held their metrics


def test_the_export_records_what_its_own_weights_scored():
    from hibert.runtime.validation import exported_metrics

    one = {"valid_rouge": 31.5, "valid_ppl": 640.0}
    assert exported_metrics({"300": one}) == one
    assert exported_metrics({"300": one, "400": {"valid_rouge": 30.0}}) == {}  # an average: never evaluated
    assert exported_metrics({"300": None}) == {}


def test_the_served_batch_bound_comes_from_the_server_not_the_request():
    """A served model decodes at most 16 documents together unless its operator raises the bound (its
    model_config, which the flavor declares so that MLflow passes it on); a bad bound stops the load."""
    from mlflow.exceptions import MlflowException

    from hibert.finetune.serving.flavor import MODEL_CONFIG
    from hibert.finetune.serving.pyfunc import _max_batch

    assert set(MODEL_CONFIG) == {"stanza_dir", "device", "max_batch_size"}
    assert _max_batch(MODEL_CONFIG["max_batch_size"]) == 16 and _max_batch(64) == 64 and _max_batch("256") == 256
    for value, needle in [(0, "model_config max_batch_size 0: must be >= 1"), ("many", "must be a whole number"),
                          (True, "must be a whole number"), (64.5, "must be a whole number")]:
        with pytest.raises(MlflowException, match=needle):
            _max_batch(value)
    # a model whose own batch size (the signature's default, which MLflow fills in for a request that gives none)
    # is above the bound is served at the bound; a larger batch asked for is refused
    from hibert.config.abstractive import GenerationConfig
    from hibert.finetune.serving.pyfunc import HibertPyfunc

    server = object.__new__(HibertPyfunc)
    server.max_batch_size, server.default_batch = 16, 64
    assert server._bounded(GenerationConfig(batch_size=64), 64).batch_size == 16
    assert server._bounded(GenerationConfig(batch_size=8), 8).batch_size == 8
    with pytest.raises(MlflowException, match="params.batch_size 128: this server decodes at most 16"):
        server._bounded(GenerationConfig(batch_size=128), 128)


def test_the_runtime_starts_a_task_from_run_init_and_the_decoder_from_its_pretraining_export(tmp_path):
    """`Task.init_from`, which the Trainer calls right after `build_model` for every task: the init export's encoder
    into `model.encoder`; with finetune.init_decoder the abstractive task also takes the export's masked-sentence
    decoder, and an export without one (or no run.init) is one UserError line."""
    import torch
    from safetensors.torch import save_file

    from hibert.config import load_config
    from hibert.errors import UserError
    from hibert.finetune.abstractive.task import AbstractiveTask
    from hibert.modeling.pretraining import HibertForPretraining
    from hibert.runtime.export import InitModel

    cfg = load_config(None, ["model=hibert_tiny", "decoder.layers=2", "finetune.init_decoder=true"])
    model_cfg = cfg.model.model_copy(update={"vocab_size": 64})
    torch.manual_seed(0)
    pre = HibertForPretraining(model_cfg).state_dict()
    encoder = {k.removeprefix("encoder."): v for k, v in pre.items() if k.startswith("encoder.")}
    decoder = {k.removeprefix("decoder."): v.contiguous() for k, v in pre.items() if k.startswith("decoder.")}
    save_file(decoder, str(tmp_path / "decoder.safetensors"))
    init = InitModel(encoder, model_cfg, {}, tmp_path)
    task = AbstractiveTask(cfg, model_cfg)
    model = task.build_model()
    task.init_from(model, init)
    assert all(torch.equal(v, encoder[k]) for k, v in model.encoder.state_dict().items())
    other = task.build_model()   # another random start: only what came from the export is equal
    loaded = other.load_pretraining_decoder(decoder)
    assert len(loaded) >= 8 and all(torch.equal(model.decoder.state_dict()[k], other.decoder.state_dict()[k])
                                    for k in loaded)
    with pytest.raises(UserError, match="init_decoder=true needs run.init"):
        task.init_from(task.build_model(), None)
    (tmp_path / "decoder.safetensors").unlink()
    with pytest.raises(UserError, match="decoder.safetensors"):
        task.init_from(task.build_model(), init)
