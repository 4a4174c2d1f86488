"""Segmentation through stanza (offline, spaCy variant) and SentencePiece training with the fixed ids."""
import json
import subprocess
import sys

import pytest

from hibert.data_prep import tokenizer as tok
from hibert.data_prep.records import split_paragraphs
from hibert.data_prep import segment as S
from hibert.data_prep.segment import OFFLINE_RESOURCES, SegmenterUnavailable, make_segmenter, offline_resources_dir
from hibert import tokens as T
from hibert.config.data import SegmenterConfig, TokenizerConfig


@pytest.fixture(scope="module")
def fast():
    return make_segmenter(SegmenterConfig(kind="spacy", fast=True))


def test_offline_pipeline_resources_json():
    d = offline_resources_dir()
    assert json.loads((d / "resources.json").read_text()) == OFFLINE_RESOURCES
    assert set(OFFLINE_RESOURCES["en"]) == {"lang_name", "packages", "tokenize", "default_processors",
                                            "default_dependencies"}


def test_segmentation_produces_sentences_and_tokens(fast):
    docs = [["Dr. Smith arrived at 5 p.m. on Monday. He left early!", "A second paragraph, without a stop"],
            ["Prices rose 3.5% in the U.S. last year. Analysts didn't expect it."]]
    out = fast.segment(docs)
    assert out == [[("Dr. Smith arrived at 5 p.m. on Monday.", 9), ("He left early!", 4),
                    ("A second paragraph, without a stop", 7)],
                   [("Prices rose 3.5% in the U.S. last year.", 10), ("Analysts didn't expect it.", 6)]]
    assert fast.info["library"] == "stanza" and fast.info["variant"] == "spacy" and fast.info["offline"]


def _sample_docs(repo) -> list[list[str]]:
    rows = [json.loads(line) for line in (repo / "samples" / "bbc_sample.jsonl").read_text().splitlines()[:25]]
    rows += [json.loads(line) for line in (repo / "samples" / "reuters_sample.jsonl").read_text().splitlines()[:25]]
    return [split_paragraphs(r.get("article") or r.get("body")) for r in rows]


def test_fast_path_equals_the_stanza_pipeline(fast, repo):
    """The fast path feeds the spaCy object stanza's variant builds; stanza's own Documents must agree."""
    full = make_segmenter(SegmenterConfig(kind="spacy", fast=False))
    docs = _sample_docs(repo)
    a, b = fast.segment(docs), full.segment(docs)
    assert a == b and sum(len(d) for d in a) > 400
    assert full.info["fast_path"] is False


def test_direct_fast_path_builds_the_language_stanzas_variant_builds(fast):
    """The fast path builds stanza's spaCy variant Language itself only for a stanza whose variant source was
    checked; the Language must equal the one stanza builds (config, tokenizer rules, pipes)."""
    assert S.stanza_spacy_variant_sha256() in S.VERIFIED_STANZA_SPACY_VARIANT, \
        "new stanza release: read stanza/pipeline/external/spacy.py, then add its sha256 if the recipe is unchanged"
    assert fast.pipeline is None and fast.info["built_by"].startswith("stanza's spacy variant recipe")
    assert S.segmenter_info(SegmenterConfig(kind="spacy"))["built_by"] == fast.info["built_by"]
    import stanza

    variant = stanza.Pipeline(lang="en", processors={"tokenize": "spacy"}, dir=str(offline_resources_dir()),
                              download_method=None, logging_level="WARN").processors["tokenize"]._variant.nlp
    ours = S._spacy_language()
    assert ours.config.to_str() == variant.config.to_str()
    assert ours.pipe_names == variant.pipe_names == ["sentencizer"]
    assert ours.tokenizer.to_bytes() == variant.tokenizer.to_bytes()
    assert ours.get_pipe("sentencizer").to_bytes() == variant.get_pipe("sentencizer").to_bytes()


def test_unverified_stanza_goes_through_stanza_pipeline(fast, monkeypatch):
    monkeypatch.setattr(S, "VERIFIED_STANZA_SPACY_VARIANT", set())
    cfg = SegmenterConfig(kind="spacy", fast=True)
    assert not S.direct_fast_path(cfg) and S.preload_modules(cfg) == ["stanza", "spacy"]
    seg = S.SpacySegmenter(cfg)
    assert seg.info["built_by"] == "stanza.Pipeline" and seg.pipeline is not None
    docs = [["Dr. Smith arrived at 5 p.m. on Monday. He left early!", "Prices rose 3.5% in the U.S. last year."]]
    assert seg.segment(docs) == fast.segment(docs)


def test_direct_fast_path_loads_neither_stanza_nor_torch(repo, tmp_path):
    """A fresh process (spaCy imported with torch hidden from thinc) segments exactly as the full stanza
    pipeline does, without importing stanza or torch (3-4 s of start-up per prep process); torch stays
    importable for anything else in that process."""
    docs = _sample_docs(repo)
    (tmp_path / "docs.json").write_text(json.dumps(docs))
    code = (
        "import json, sys\n"
        "from hibert.config.data import SegmenterConfig\n"
        "from hibert.data_prep.segment import make_segmenter\n"
        f"docs = json.load(open({str(tmp_path / 'docs.json')!r}))\n"
        "out = make_segmenter(SegmenterConfig(kind='spacy')).segment(docs)\n"
        "assert 'torch' not in sys.modules and 'stanza' not in sys.modules, 'loaded torch or stanza'\n"
        "import torch\n"
        "assert torch.ones(2).sum().item() == 2\n"
        "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    full = make_segmenter(SegmenterConfig(kind="spacy", fast=False))
    assert [[tuple(x) for x in d] for d in json.loads(r.stdout)] == full.segment(docs)


def test_neural_without_models_is_an_error_not_a_fallback(tmp_path):
    with pytest.raises(SegmenterUnavailable, match="kind=spacy explicitly"):
        make_segmenter(SegmenterConfig(kind="neural", stanza_dir=str(tmp_path)))
    with pytest.raises(SegmenterUnavailable):
        make_segmenter(SegmenterConfig(kind="neural"))


def test_cli_stanza_dir_selects_the_neural_tokenizer_and_fails_without_models(tmp_path, capsys, repo, monkeypatch):
    from hibert.cli import main

    monkeypatch.chdir(repo)
    assert main(["prep", "data=sample_open", f"data.output={tmp_path}", "--stanza-dir", str(tmp_path)]) == 2
    assert "kind=neural needs stanza's English models" in capsys.readouterr().err
    assert not (tmp_path / "plan.json").exists()  # refused before any work


def test_sentencepiece_special_ids(tmp_path, fast, repo):
    rows = [json.loads(line) for line in (repo / "samples" / "reuters_sample.jsonl").read_text().splitlines()[:150]]
    sents = [t for d in fast.segment([split_paragraphs(r["body"]) for r in rows]) for t, _ in d]
    path = tok.train(sents, TokenizerConfig(vocab_size=1000, hard_vocab_limit=False, model_type="bpe"), tmp_path)
    assert tok.train(sents, TokenizerConfig(vocab_size=1000, hard_vocab_limit=False, model_type="bpe"),
                     tmp_path / "again").read_bytes() == path.read_bytes()  # deterministic
    sp = tok.load(path)
    pieces = [sp.id_to_piece(i) for i in range(6)]
    assert pieces == ["<pad>", "<unk>", "<s>", "</s>", "[MASK]", "[SEP]"]
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (T.PAD_ID, T.UNK_ID, T.BOS_ID, T.EOS_ID)
    ids = sp.encode(sents[0])
    assert ids and min(ids) > T.SEP_ID and sp.decode(ids) == sents[0]
    assert (tmp_path / "tokenizer.vocab").read_text().splitlines()[4] == "[MASK]\t0"
    assert not list(tmp_path.glob(".*"))
    # a model with other special ids is refused
    import sentencepiece as spm
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sents), model_prefix=str(tmp_path / "foreign"),
                                   vocab_size=500, hard_vocab_limit=False, minloglevel=2)
    with pytest.raises(ValueError, match="special ids"):
        tok.load(tmp_path / "foreign.model")


@pytest.fixture(scope="module")
def tiny_stanza(tmp_path_factory):
    from stanza_tiny import build

    return build(tmp_path_factory.mktemp("stanza"))


def test_neural_segmenter_runs_a_real_stanza_model(tiny_stanza):
    seg = make_segmenter(SegmenterConfig(kind="neural", stanza_dir=str(tiny_stanza)))
    out = seg.segment([["The council approved the budget. It includes money for schools."],
                       ["Shares rose 3% on Monday.", "Analysts expect more gains."]])
    assert [len(doc) for doc in out] == [2, 2]   # the sentence ends it was trained on
    assert out[0][0][0] == "The council approved the budget." and out[1][1][0] == "Analysts expect more gains."
    assert all(n >= 1 for doc in out for _, n in doc)
    assert seg.info["kind"] == "neural" and seg.info["models"] == ["tiny.pt"]


def test_prep_with_stanza_dir_uses_the_neural_model_and_says_so(tiny_stanza, tmp_path, repo, monkeypatch):
    from hibert.cli import main

    monkeypatch.chdir(repo)
    src = repo / "tests" / "fixtures" / "data_prep" / "jsonl" / "articles.jsonl"
    out = tmp_path / "neural"
    code = main(["prep", "data=sample_open", f"data.output={out}", "--stanza-dir", str(tiny_stanza), "--workers", "1",
                 f"data.sources=[{{format: jsonl, path: {src}, name: art, text_field: body, id_field: doc_id}}]",
                 "data.tokenizer.vocab_size=60", "data.valid_fraction=0", "data.test_fraction=0"])
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    seg = manifest["segmenter"]
    assert seg["kind"] == "neural" and seg["models"] == ["tiny.pt"] and seg["model_dir"] == str(tiny_stanza)
    c = manifest["counts"]
    n_docs = len(src.read_text().splitlines())
    assert c["docs_in"] == n_docs == c["kept"] + sum(c["skipped"].values()) and c["sentences"] >= c["kept"]
