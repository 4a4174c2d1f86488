"""The fast Porter stemmer is nltk's, word for word (it decides oracle labels, which must equal rouge-score's),
and the oracle's tokenizer is rouge-score's tokenizer on awkward input."""
import json
import logging
import re
import subprocess
import sys

import pytest
from nltk.stem import porter
from rouge_score import tokenizers

from hibert.data_prep import porter as fast
from hibert.data_prep.oracle import RougeTokenizer

from conftest import REPO, SHARED


def _vocabulary(paths) -> list[str]:
    words: set[str] = set()
    for path in paths:
        for line in path.open(encoding="utf-8"):
            for value in json.loads(line).values():
                if isinstance(value, str):
                    words.update(re.sub(r"[^a-z0-9]+", " ", value.lower()).split())
    return sorted(w for w in words if len(w) > 3)   # rouge-score stems only words longer than 3


def test_hand_cases():
    cases = {"caresses": "caress", "ponies": "poni", "ties": "tie", "cats": "cat", "agreed": "agre",
             "hopping": "hop", "falling": "fall", "filing": "file", "happy": "happi", "relational": "relat",
             "generalization": "gener", "controll": "control", "dying": "die", "skies": "sky", "1990s": "1990",
             "yyyy": "yyyi", "running": "run", "conditionally": "condit"}
    assert {w: fast.porter_stem(w) for w in cases} == cases
    ref = porter.PorterStemmer().stem
    assert all(fast.porter_stem(w) == ref(w) for w in cases)


def test_every_probe_word_and_the_shipped_samples_stem_like_nltk(repo):
    ref = porter.PorterStemmer().stem
    words = sorted(set(fast.PROBE) | set(_vocabulary(sorted((repo / "samples").glob("*.jsonl")))))
    assert len(words) > 10_000
    wrong = [(w, ref(w), fast.porter_stem(w)) for w in words if fast.porter_stem(w) != ref(w)]
    assert wrong == []


@pytest.mark.skipif(not (SHARED / "data").is_dir(), reason="needs ../shared/data")
def test_the_whole_vocabulary_of_the_shared_corpora_stems_like_nltk():
    ref = porter.PorterStemmer().stem
    words = _vocabulary(sorted((SHARED / "data").rglob("*.jsonl")))
    assert len(words) > 50_000
    wrong = [(w, ref(w), fast.porter_stem(w)) for w in words if fast.porter_stem(w) != ref(w)]
    assert wrong == []


def test_falls_back_to_nltk_when_they_disagree(monkeypatch, caplog):
    monkeypatch.setattr(fast, "VERIFIED_NLTK_PORTER", set())   # an nltk release it was never compared with
    assert fast.make_stemmer() is fast.porter_stem              # ... that stems the probe words alike
    original = porter.PorterStemmer.stem
    monkeypatch.setattr(porter.PorterStemmer, "stem",
                        lambda self, w, to_lowercase=True: "x" if w == "ponies" else original(self, w, to_lowercase))
    with caplog.at_level(logging.WARNING, logger="hibert.data_prep.porter"):
        stem = fast.make_stemmer()
    assert stem is not fast.porter_stem and stem("ponies") == "x"
    assert "ponies" in caplog.text


def test_a_verified_nltk_is_not_even_imported():
    if fast.nltk_porter_sha256() not in fast.VERIFIED_NLTK_PORTER:
        pytest.skip("this nltk's porter.py is not in VERIFIED_NLTK_PORTER: the probe decides (tested above)")
    code = ("import sys; from hibert.data_prep.porter import make_stemmer, porter_stem; "
            "assert make_stemmer() is porter_stem; assert 'nltk' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_tokenizer_on_awkward_text():
    texts = ["a|b c", "Newword newword NEWWORD newwords", "", "1990s 3.5% x-ray", "tab\there\nnewline", "|||"]
    tok = RougeTokenizer()
    ids, lens = tok.ids_flat(texts)
    inv = {v: k for k, v in tok._stem_ids.items()}
    ref = tokenizers.DefaultTokenizer(use_stemmer=True)
    k = 0
    for text, n in zip(texts, lens):
        assert [inv[i] for i in ids[k:k + n]] == ref.tokenize(text), text
        k += n
    assert k == len(ids) and len(lens) == len(texts)
    assert list(lens) == [3, 4, 0, 5, 3, 0]   # "3.5%" is two tokens, "x-ray" two
