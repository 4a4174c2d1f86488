"""`hibert evaluate` and `hibert summarize` for abstractive models: decoding flags, the report (ROUGE with CIs
next to Lead-3 and the oracle, paired bootstrap against Lead-3 and any other run's report, novel n-gram
rates, length and repetition), and raw text -> abstract."""
from __future__ import annotations

import argparse
import json
import logging
import operator
from pathlib import Path
from typing import Any

log = logging.getLogger("hibert.evaluate")


# command-line flag -> (argparse attribute, `generation:` field); the bounds are the schema's
DECODING_FLAGS = {"--beam": ("beam", "beam_size"), "--min-len": ("min_len", "min_length"),
                  "--max-len": ("max_len", "max_length"), "--length-penalty": ("length_penalty", "length_penalty"),
                  "--no-repeat-ngram": ("no_repeat_ngram", "no_repeat_ngram"),
                  "--max-word-pieces": ("max_word_pieces", "max_word_pieces"),
                  "--batch-size": ("batch_size", "batch_size")}
_BOUNDS = (("ge", operator.ge, ">="), ("gt", operator.gt, ">"), ("le", operator.le, "<="), ("lt", operator.lt, "<"))


class DecodingFlagError(ValueError):
    """A decoding flag that cannot work (alone, with another flag, or with the model): one line for the user,
    naming the flag."""


def add_generation_arguments(p: argparse.ArgumentParser) -> None:
    # plain int/float here: the bounds are checked by `check_generation_flags` (one line naming the flag)
    g = p.add_argument_group("decoding (abstractive models; default: the model's generation.json)")
    g.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy)")
    g.add_argument("--min-len", type=int, default=None, help="minimum summary length in subwords")
    g.add_argument("--max-len", type=int, default=None, help="maximum summary length in subwords (below the "
                   "decoder's max_positions)")
    g.add_argument("--length-penalty", type=float, default=None, help="GNMT length penalty alpha")
    g.add_argument("--no-repeat-ngram", type=int, default=None, help="block repeated word n-grams (0 = off)")
    g.add_argument("--max-word-pieces", type=int, default=None,
                   help="at most this many subwords per word (0 = no cap)")
    g.add_argument("--batch-size", type=int, default=None, help="documents decoded together")


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The decoding flags on the command line: flag -> value."""
    return {flag: getattr(args, dest) for flag, (dest, _) in DECODING_FLAGS.items()
            if getattr(args, dest, None) is not None}


def check_generation_flags(args: argparse.Namespace) -> None:
    """What the decoding flags tell without a model: each within the `generation:` schema's bounds, and
    --min-len <= --max-len when both are given. Raises `DecodingFlagError` naming the flag."""
    from hibert.config.abstractive import GenerationConfig

    given = _given(args)
    for flag, value in given.items():
        for bound in GenerationConfig.model_fields[DECODING_FLAGS[flag][1]].metadata:
            for attr, ok, word in _BOUNDS:
                limit = getattr(bound, attr, None)
                if limit is not None and not ok(value, limit):  # NaN fails every comparison
                    raise DecodingFlagError(f"{flag} {value}: must be {word} {limit}")
    if "--min-len" in given and "--max-len" in given and given["--min-len"] > given["--max-len"]:
        raise DecodingFlagError(f"--min-len {given['--min-len']} is above --max-len {given['--max-len']}: "
                                "the minimum summary length cannot exceed the maximum")


def generation_from_args(base, args: argparse.Namespace, max_positions: int | None = None):
    """The export's generation settings with the command line's flags on top, checked: every flag (see
    `check_generation_flags`), the minimum against the maximum length wherever each comes from, and (given the
    decoder's `max_positions`) max_length + 1 target positions against the decoder's table. Raises
    `DecodingFlagError` naming the flag (or, for a setting of the export's own, the file)."""
    check_generation_flags(args)
    given = _given(args)
    settings = {**base.model_dump(), **{DECODING_FLAGS[f][1]: v for f, v in given.items()}}
    low, high = settings["min_length"], settings["max_length"]
    if low > high:  # not both flags (check_generation_flags): one side is the model's generation.json
        if "--min-len" in given:
            raise DecodingFlagError(f"--min-len {low} is above the model's maximum length {high} (generation.json); "
                                    "pass --max-len too")
        if "--max-len" in given:
            raise DecodingFlagError(f"--max-len {high} is below the model's minimum length {low} (generation.json); "
                                    "pass --min-len too")
    if max_positions is not None and high + 1 > max_positions:
        what = f"--max-len {high}" if "--max-len" in given else f"the model's generation.json max_length {high}"
        raise DecodingFlagError(f"{what}: the model's decoder has {max_positions} target positions (decoder."
                                f"max_positions in abstractive.json), so at most --max-len {max_positions - 1}")
    return type(base).model_validate(settings)


def generation_for_export(export_dir: Path, args: argparse.Namespace):
    """`generation_from_args` for an abstractive (or mds) export, read from its generation.json and
    abstractive.json without loading any weights: decoding flags that cannot work fail before the model
    loads."""
    from finetune.abstractive_inference import decoder_max_positions, stored_generation

    return generation_from_args(stored_generation(export_dir), args, decoder_max_positions(export_dir))


def is_abstractive_export(local: Path) -> bool:
    from finetune.abstractive_task import DECODER_CONFIG

    return (Path(local) / DECODER_CONFIG).is_file()


def compared_reports(paths: list[str], split: str) -> dict[str, dict[str, Any]]:
    """`--compare NAME=PATH`: another run's report (report.json, its directory, or a run dir holding
    report-<split>/report.json) whose per-document model scores are paired with this model's."""
    out: dict[str, dict[str, Any]] = {}
    for item in paths:
        name, _, path = item.rpartition("=")
        p = Path(path)
        for cand in (p, p / "report.json", p / f"report-{split}" / "report.json"):
            if cand.is_file():
                report = json.loads(cand.read_text())
                out[name or cand.parent.parent.name] = report
                break
        else:
            raise SystemExit(f"hibert: report {item!r}: no report.json there (run `hibert evaluate` for that run "
                             "first)")
    return out


def pair_with_reports(result: dict[str, Any], reports: dict[str, dict[str, Any]], n_resamples: int) -> None:
    """Add `model-<name>` paired differences against other runs' per-document scores (same documents)."""
    import numpy as np

    from finetune.evaluation import HEADLINE
    from finetune.rouge_eval import paired_bootstrap

    ours = dict(zip(result["doc_ids"], range(len(result["doc_ids"]))))
    for name, rep in reports.items():
        theirs = rep.get("per_document", {})
        ids = theirs.get("doc_ids", [])
        common = [d for d in ids if d in ours]
        if not common or "model" not in theirs:
            raise SystemExit(f"hibert evaluate: --compare {name}: its report shares no documents with this one")
        if len(common) != len(ours):
            log.warning("--compare %s: paired over the %d documents both reports hold (of %d)", name, len(common),
                        len(ours))
        a_idx = [ours[d] for d in common]
        b_idx = [ids.index(d) for d in common]
        result["paired"][f"model-{name}"] = {
            m: paired_bootstrap(np.asarray(result["per_document"]["model"][m])[a_idx] * 1.0,
                                np.asarray(theirs["model"][m])[b_idx] * 1.0, n_resamples)
            for m in HEADLINE}


def evaluate_abstractive(cfg, args: argparse.Namespace, local: Path, ref: str, uri: str) -> dict[str, Any]:
    """Decode a split with an abstractive export and write the report; returns what the CLI prints."""
    import torch

    from data_prep import DocumentDataset
    from finetune.abstractive_data import FirstChunks
    from finetune.abstractive_inference import Decoder, load_abstractive
    from finetune.abstractive_metrics import abstractiveness
    from finetune.evaluation import baseline_systems, documents, score_systems, write_report
    from hibert.redact import redact_uri
    from hibert.hashing import file_hash

    device = "cuda" if torch.cuda.is_available() else "cpu"
    reports = compared_reports(args.compare, args.split)   # bad --compare fails before any decoding
    model, meta = load_abstractive(local, device)
    gen = generation_from_args(meta["generation"], args)
    test = DocumentDataset(cfg.data.dataset_dir, args.split)
    view = FirstChunks(test)
    if len(view) == 0:
        raise SystemExit(f"hibert evaluate: split {args.split!r} of {cfg.data.dataset_dir} has no documents "
                         "with summaries")
    docs = documents(test)                  # whole documents: Lead-3, the oracle and novelty see all of them
    first = {view.source_doc(i): i for i in range(len(view))}
    docs = [d for d in docs if d.doc_id in first]
    if args.limit:
        docs = docs[: args.limit]
    decoder = Decoder(model, test.tokenizer_path, gen, device)
    decoded = decoder.summarize_ids([view[first[d.doc_id]] for d in docs])
    systems = {"model": [x.sentences for x in decoded], **baseline_systems(docs)}
    result = score_systems(docs, systems, n_resamples=args.bootstrap)
    pair_with_reports(result, reports, args.bootstrap)
    sources = [d.sentences for d in docs]
    result["abstractiveness"] = {name: abstractiveness(s, sources) for name, s in systems.items()}
    manifest = Path(cfg.data.dataset_dir) / "manifest.json"
    report_meta = {"task": "abstractive", "model": redact_uri(ref), "encoder_init": meta.get("init"),
                   "dataset": str(cfg.data.dataset_dir), "split": args.split,
                   "generation": gen.model_dump(), "reads": "the first chunk of each document "
                   f"(<= {model.encoder.cfg.max_positions} positions; data.max_doc_sentences sentences)",
                   "lead3": "the first 3 sentences", "compared_with": sorted(reports),
                   "dataset_manifest": file_hash(manifest) if manifest.is_file() else "none",
                   "finetune_run": meta.get("mlflow_run_id")}
    out = Path(args.out) if args.out else cfg.run_dir / f"report-{args.split}"
    paths = write_report(out, result, docs, report_meta)
    return {"result": result, "paths": paths, "meta": report_meta, "out": out}
