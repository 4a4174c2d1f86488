"""nltk's Porter stemmer (NLTK_EXTENSIONS mode, the one rouge-score stems with), faster
(benchmarks/bench_oracle.py times both on the CNN/DM words).

Same rules, same order, same conditions as `nltk.stem.porter.PorterStemmer().stem`; the speed comes from
finding a step's rule by suffix lookups in a dict instead of calling `endswith` on every rule, and from
computing the consonant/vowel pattern with `str.translate` instead of a per-letter Python loop. Oracle labels
must equal rouge-score's, so `make_stemmer()` only returns this one when the installed nltk's porter.py is a
version it was checked against word for word (by file hash; importing nltk costs ~2 s, it pulls in scipy), or
else after it stems a probe list (every rule, every NLTK extension, the irregular forms) exactly as the
installed nltk does; otherwise it returns nltk's own stemmer and logs why. tests/test_data_prep_porter.py
compares the two on every word of the shipped corpora.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

# Consonant/vowel pattern: a, e, i, o, u are vowels; y is a consonant at the start or after a vowel and a vowel
# after a consonant; every other letter or digit is a consonant (rouge-score's tokens are [a-z0-9]+).
_CV = str.maketrans({c: ("v" if c in "aeiou" else "y" if c == "y" else "c")
                     for c in "abcdefghijklmnopqrstuvwxyz0123456789"})

_POOL = {"sky": "sky", "skies": "sky", "dying": "die", "lying": "lie", "tying": "tie", "news": "news",
         "innings": "inning", "inning": "inning", "outings": "outing", "outing": "outing",
         "cannings": "canning", "canning": "canning", "howe": "howe", "proceed": "proceed",
         "exceed": "exceed", "succeed": "succeed"}


def _cv(w: str) -> str:
    s = w.translate(_CV)
    if "y" not in s:
        return s
    out = []
    prev = "v"          # so that a leading y is a consonant
    for ch in s:
        if ch == "y":
            ch = "v" if prev == "c" else "c"
        out.append(ch)
        prev = ch
    return "".join(out)


def _m(w: str) -> int:
    """Porter's measure: the number of VC sequences."""
    return _cv(w).count("vc")


def _ends_cvc(w: str) -> bool:
    cv = _cv(w)
    if len(w) >= 3:
        return cv.endswith("cvc") and w[-1] not in "wxy"
    return len(w) == 2 and cv == "vc"


# Step rule tables, in nltk's list order, grouped by the suffix's last two letters (every suffix has two or
# more): nltk's _apply_rule_list takes the first rule in list order whose suffix ends the word, and only rules
# in the word's own group can.
def _table(rules: list[tuple[str, str]]) -> dict[str, tuple[tuple[str, str], ...]]:
    table: dict[str, tuple[tuple[str, str], ...]] = {}
    for suffix, rep in rules:
        table[suffix[-2:]] = (*table.get(suffix[-2:], ()), (suffix, rep))
    return table


_STEP2 = _table([
    ("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"), ("izer", "ize"), ("bli", "ble"),
    ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous"), ("ization", "ize"), ("ation", "ate"),
    ("ator", "ate"), ("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous"),
    ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"), ("fulli", "ful"), ("logi", "log")])
_STEP3 = _table([("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"), ("ful", ""),
                 ("ness", "")])
_STEP4 = _table([(s, "") for s in ("al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent",
                                  "ion", "ou", "ism", "ate", "iti", "ous", "ive", "ize")])


def _first_rule(w: str, table: dict[str, tuple[tuple[str, str], ...]]) -> tuple[str, str] | None:
    for rule in table.get(w[-2:], ()):
        if w.endswith(rule[0]):
            return rule
    return None


def _step1a(w: str) -> str:
    if w.endswith("ies") and len(w) == 4:
        return w[:-3] + "ie"
    if w.endswith("sses"):
        return w[:-2]
    if w.endswith("ies"):
        return w[:-2]
    if w.endswith("ss"):
        return w
    if w.endswith("s"):
        return w[:-1]
    return w


def _step1b(w: str) -> str:
    if w.endswith("ied"):
        return w[:-3] + ("ie" if len(w) == 4 else "i")
    if w.endswith("eed"):
        stem = w[:-3]
        return stem + "ee" if _m(stem) > 0 else w
    if w.endswith("ed"):
        stem = w[:-2]
    elif w.endswith("ing"):
        stem = w[:-3]
    else:
        return w
    if "v" not in _cv(stem):
        # nltk tries "ed" then "ing"; a word ending in "ed" cannot end in "ing", so no second chance
        return w
    if stem.endswith(("at", "bl", "iz")):
        return stem + "e"
    if len(stem) >= 2 and stem[-1] == stem[-2] and _cv(stem)[-1] == "c":
        return stem[:-1] if stem[-1] not in "lsz" else stem
    if _m(stem) == 1 and _ends_cvc(stem):
        return stem + "e"
    return stem


def _step1c(w: str) -> str:
    if w.endswith("y"):
        stem = w[:-1]
        if len(stem) > 1 and _cv(stem)[-1] == "c":
            return stem + "i"
    return w


def _step2(w: str) -> str:
    if w.endswith("alli") and _m(w[:-4]) > 0:
        return _step2(w[:-4] + "al")
    hit = _first_rule(w, _STEP2)
    if hit is None:
        return w
    suffix, rep = hit
    stem = w[:-len(suffix)]
    ok = _m(w[:-3]) > 0 if suffix == "logi" else _m(stem) > 0
    return stem + rep if ok else w


def _step3(w: str) -> str:
    hit = _first_rule(w, _STEP3)
    if hit is None:
        return w
    suffix, rep = hit
    stem = w[:-len(suffix)]
    return stem + rep if _m(stem) > 0 else w


def _step4(w: str) -> str:
    hit = _first_rule(w, _STEP4)
    if hit is None:
        return w
    suffix = hit[0]
    stem = w[:-len(suffix)]
    if suffix == "ion":
        # nltk evaluates stem[-1] only when the measure passes, so an empty stem cannot reach it
        return stem if _m(stem) > 1 and stem[-1] in "st" else w
    return stem if _m(stem) > 1 else w


def _step5a(w: str) -> str:
    if w.endswith("e"):
        stem = w[:-1]
        m = _m(stem)
        if m > 1 or (m == 1 and not _ends_cvc(stem)):
            return stem
    return w


def _step5b(w: str) -> str:
    if w.endswith("ll") and _m(w[:-1]) > 1:
        return w[:-1]
    return w


def porter_stem(word: str) -> str:
    """nltk.stem.porter.PorterStemmer().stem(word) for lower-case ASCII letters and digits."""
    w = word.lower()
    pooled = _POOL.get(w)
    if pooled is not None:
        return pooled
    if len(word) <= 2:
        return w
    return _step5b(_step5a(_step4(_step3(_step2(_step1c(_step1b(_step1a(w))))))))


# Words that exercise every rule, NLTK extension and irregular form (most are nltk's and Porter's examples).
PROBE = """caresses ponies ties caress cats dies feed agreed plastered bled motoring sing conflated troubled
sized hopping tanned falling hissing fizzed failing filing happy sky enjoy spy fly try relational conditional
rational valenci hesitanci digitizer conformabli radicalli differentli vileli analogousli vietnamization
predication operator feudalism decisiveness hopefulness callousness formaliti sensitiviti sensibiliti
triplicate formative formalize electriciti electrical hopeful goodness revival allowance inference airliner
gyroscopic adjustable defensible irritant replacement adjustment dependent adoption homologou communism
activate angulariti homologous effective bowdlerize probate rate cease controll roll generalization
oscillators generously analogously fully tying lying dying skies news innings inning outings canning howe
proceed exceed succeed cried spied died tied flies ied yyyy syzygy toying played boyish layer yeses
archaeology theology biology logi apology criticism electricity traditionally universally hopefully
beautifully ied hied agreement settlement dyed eyed ion lion onion station abed aed bleed conditionally
national rationalize realization sensational emotionally physically sociology eying saying obeying yelling
yellowish annoyingly""".split()


# sha256 of nltk/stem/porter.py in the nltk releases this stemmer was compared with on the whole vocabulary
# of the shared corpora (84k words) and the probe list: 3.10.4.
VERIFIED_NLTK_PORTER = {"2d75d36dc9e83fc40857c72632fa1ea59208b531c5a91a765b62e63af57fa7d4"}


def nltk_porter_sha256() -> str | None:
    """Hash of the installed nltk/stem/porter.py, found without importing nltk."""
    spec = importlib.util.find_spec("nltk")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "stem" / "porter.py"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def make_stemmer() -> Callable[[str], str]:
    """`porter_stem` when it is known or seen to match the installed nltk, else nltk's stemmer itself."""
    if nltk_porter_sha256() in VERIFIED_NLTK_PORTER:
        return porter_stem
    from nltk.stem import porter  # lazy: ~1.1 s, paid only when this nltk's porter.py is not a verified one

    reference = porter.PorterStemmer().stem
    wrong = [w for w in PROBE if porter_stem(w) != reference(w)]
    if wrong:
        log.warning("fast Porter stemmer disagrees with this nltk on %s; using nltk's (slower)", wrong[:5])
        return reference
    return porter_stem
