"""Oracle labels: docs/s of the fast exact oracle against two references, on CNN/DM and BBC, same run.

(a) naive greedy: every candidate set re-scored with rouge-score (exact ROUGE, slow);
(b) PreSumm's greedy_selection: per-sentence n-gram sets, unstemmed set-based "ROUGE" (fast, approximate);
ours: exact stemmed count-based ROUGE-1 F + ROUGE-2 F like (a), precomputed n-gram counts, numpy scoring.
Sentences are the ones `hibert prep` produces (CNN/DM: PTB split + detokenization; BBC: stanza segmentation,
summary sentences restored from the glued text); preparing them is not timed. Times are single-process.
"cold" starts with an empty stem cache (every word of the corpus is stemmed during the timed run); "warm"
reruns with it filled, which is how prep runs at scale (one cache per worker over whole shards).
The stemmer alone: data_prep/porter.py's `porter_stem` against nltk's `PorterStemmer().stem` (what rouge-score
stems with) on every distinct token of the CNN/DM articles and highlights that rouge-score stems (longer than 3
characters), each word once per round (no cache), same run.

    python benchmarks/bench_oracle.py
    python benchmarks/bench_oracle.py --reference-docs 200      # (a) on the first 200 docs only
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hibert.data_prep.oracle import RougeTokenizer, oracle_labels  # noqa: E402
from hibert.data_prep.oracle_reference import greedy_presumm, greedy_rouge_score, set_score  # noqa: E402
from hibert.data_prep.ptb import detokenize, split_sentences  # noqa: E402
from hibert.data_prep.records import split_paragraphs  # noqa: E402
from hibert.data_prep.summaries import split_glued  # noqa: E402
from workload import machine  # noqa: E402  (benchmarks/ is the script's own folder)

SHARED = REPO.parent / "shared" / "data"


def load_cnndm(path: Path) -> list[tuple[list[str], list[str]]]:
    docs = []
    for line in path.open(encoding="utf-8"):
        r = json.loads(line)
        sents = [detokenize(s) for s in split_sentences(r["article"])]
        summ = [detokenize(s.split()) for s in r["highlights"].split(" . ") if s.strip()]
        docs.append((sents, summ))
    return docs


def load_bbc(path: Path) -> list[tuple[list[str], list[str]]]:
    from hibert.data_prep.segment import make_segmenter
    from hibert.config.data import SegmenterConfig

    seg = make_segmenter(SegmenterConfig())
    rows = [json.loads(line) for line in path.open(encoding="utf-8")]
    arts = seg.segment([split_paragraphs(r["article"]) for r in rows])
    summs = seg.segment([split_glued(r["summary"], r["article"]) for r in rows])
    return [([t for t, _ in a], [t for t, _ in s]) for a, s in zip(arts, summs)]


def timed(fn, docs):
    t0, c0 = time.perf_counter(), time.process_time()
    out = [fn(s, m) for s, m in docs]
    return out, time.perf_counter() - t0, time.process_time() - c0


def bench(name: str, docs, reference_docs: int | None, max_sentences: int, repeat: int) -> dict:
    runs = {"cold": [], "warm": [], "beam5": [], "presumm": []}
    for _ in range(repeat):     # medians over interleaved repeats: this machine's speed drifts by +-25%
        tok = RougeTokenizer()  # cold: a fresh stem cache fills during the timed run
        greedy = lambda s, m: tuple(np.flatnonzero(oracle_labels(s, m, max_sentences, tokenizer=tok)))  # noqa: E731
        ours, t, c = timed(greedy, docs)
        runs["cold"].append((t, c))
        ours_warm, t, c = timed(greedy, docs)
        runs["warm"].append((t, c))
        assert ours_warm == ours
        beam, t, c = timed(lambda s, m: tuple(np.flatnonzero(
            oracle_labels(s, m, max_sentences, method="beam", beam_size=5, tokenizer=tok))), docs)
        runs["beam5"].append((t, c))
        presumm, t, c = timed(lambda s, m: tuple(greedy_presumm(s, m, max_sentences)), docs)
        runs["presumm"].append((t, c))
    med = {k: (statistics.median(t for t, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
    t_ours, c_ours = med["cold"]
    t_warm, c_warm = med["warm"]
    t_beam, c_beam = med["beam5"]
    t_ps, c_ps = med["presumm"]
    ref_docs = docs[:reference_docs] if reference_docs else docs
    naive, t_naive, c_naive = timed(lambda s, m: tuple(greedy_rouge_score(s, m, max_sentences)), ref_docs)
    n, nr = len(docs), len(ref_docs)
    mean = lambda sel: float(np.mean([set_score(s, m, c) for (s, m), c in zip(docs, sel)]))  # noqa: E731
    return {
        "corpus": name, "docs": n, "repeats": repeat,
        "cold_docs_per_s_each_run": [round(n / t, 1) for t, _ in runs["cold"]],
        "warm_docs_per_s_each_run": [round(n / t, 1) for t, _ in runs["warm"]], "mean_sentences": round(float(np.mean([len(s) for s, _ in docs])), 1),
        "docs_per_s": {"ours_cold": round(n / t_ours, 1), "ours_warm": round(n / t_warm, 1),
                       "ours_beam5": round(n / t_beam, 1), "presumm_b": round(n / t_ps, 1),
                       "naive_rouge_score_a": round(nr / t_naive, 2)},
        "docs_per_cpu_s": {"ours_cold": round(n / c_ours, 1), "ours_warm": round(n / c_warm, 1),
                           "presumm_b": round(n / c_ps, 1), "naive_rouge_score_a": round(nr / c_naive, 2)},
        "reference_a_docs": nr,
        "identical_to_a": sum(a == b for a, b in zip(ours, naive)),
        "identical_to_b": sum(a == b for a, b in zip(ours, presumm)),
        "mean_rouge1f_plus_rouge2f": {"ours_greedy": round(mean(ours), 4), "ours_beam5": round(mean(beam), 4),
                                      "presumm_b": round(mean(presumm), 4)},
        "beam_better_docs": sum(set_score(s, m, b) > set_score(s, m, g) for (s, m), b, g in zip(docs, beam, ours)),
    }


def stemmers(docs, repeat: int) -> dict:
    """Words/s of the exact fast Porter stemmer and of nltk's on the corpus's distinct rouge-score tokens (a cold
    stem cache sees each once), medians over interleaved rounds, and how many stems are identical."""
    from nltk.stem.porter import PorterStemmer

    from hibert.data_prep.porter import porter_stem

    # rouge-score's tokens ([a-z0-9]+ of the lower-cased text); it stems only those longer than 3 characters
    words = sorted({w for sents, summ in docs for text in (*sents, *summ)
                    for w in re.sub(r"[^a-z0-9]+", " ", text.lower()).split() if len(w) > 3})
    nltk_stem = PorterStemmer().stem
    rounds: dict[str, list[float]] = {"ours": [], "nltk": []}
    for _ in range(max(1, repeat)):
        for name, fn in (("ours", porter_stem), ("nltk", nltk_stem)):
            t0 = time.perf_counter()
            out = [fn(w) for w in words]
            rounds[name].append(time.perf_counter() - t0)
            if name == "ours":
                ours = out
    theirs = [nltk_stem(w) for w in words]
    med = {k: statistics.median(v) for k, v in rounds.items()}
    return {"corpus": "cnndm", "distinct_words": len(words),
            "words_per_s": {k: round(len(words) / t, 1) for k, t in med.items()},
            "words_per_s_each_run": {k: [round(len(words) / t, 1) for t in v] for k, v in rounds.items()},
            "speedup": round(med["nltk"] / med["ours"], 3),
            "identical": sum(a == b for a, b in zip(ours, theirs))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cnndm", default=str(SHARED / "in_domain" / "cnndm_train.jsonl"))
    ap.add_argument("--bbc", default=str(SHARED / "extractive" / "bbc_news_summary.jsonl"))
    ap.add_argument("--reference-docs", type=int, default=None, help="run (a) on the first N docs only")
    ap.add_argument("--max-sentences", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of ours and (b) (medians are reported)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "bench_oracle.json"))
    args = ap.parse_args()
    cnndm = load_cnndm(Path(args.cnndm))
    results = [bench("cnndm", cnndm, args.reference_docs, args.max_sentences, args.repeat),
               bench("bbc", load_bbc(Path(args.bbc)), args.reference_docs, args.max_sentences, args.repeat)]
    out = {"benchmark": "bench_oracle", "machine": machine(), "host": platform.node(), "cpus": os.cpu_count(),
           "loadavg_at_end": os.getloadavg(), "max_sentences": args.max_sentences, "results": results,
           "stemmer": stemmers(cnndm, args.repeat)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
