"""Evaluation reports of summaries: the model, Lead-3, the oracle and any other named system on the same
documents, ROUGE with bootstrap CIs and paired differences (against the baselines and, `--compare`, against
other runs' reports), written as Markdown + JSON + PNG."""
from __future__ import annotations

import html
import json
import logging
from collections import defaultdict
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hibert.errors import UserError
from hibert.finetune.evaluation.rouge import Rouge, format_p, paired_bootstrap, summarize_scores, verdict

# under every paired table of a single-run report
ONE_SEED = ("One training seed of this model: its intervals carry document variance only, and another seed can "
            "move it by more than these differences; order trained systems with `hibert compare NAME=run ...` over "
            "several seeds (`--seeds` / `slurm.seeds`).")
from hibert.finetune.base.selection import lead, oracle_from_labels
from hibert.finetune.evaluation.viewer import meta_text, write_viewer

log = logging.getLogger("hibert.evaluate")
HEADLINE = ("rouge1_f", "rouge2_f", "rougeL_f", "rougeLsum_f")


@dataclass
class Document:
    doc_id: str
    sentences: list[str]
    references: list[list[str]]        # one or more reference summaries, each a list of sentences
    labels: np.ndarray | None          # oracle labels over the whole document


# the documents `documents()` left out for want of a reference summary, by split, while an evaluation records them
_LEFT_OUT: ContextVar[dict[str, list[str]] | None] = ContextVar("left_out", default=None)


@contextmanager
def recording_left_out() -> Iterator[dict[str, list[str]]]:
    """{split: ids of the documents without a reference summary} that `documents()` saw while the block ran."""
    record: dict[str, list[str]] = {}
    token = _LEFT_OUT.set(record)
    try:
        yield record
    finally:
        _LEFT_OUT.reset(token)


def documents(dataset) -> list[Document]:
    """Group a split's chunks into whole documents (chunks of one source document, in order). A document with
    no reference summary cannot be scored: it is left out, with a warning that counts them; a split where no
    document has one is a UserError."""
    chunks: dict[str, list[int]] = defaultdict(list)
    for i in range(len(dataset)):
        chunks[dataset.source_doc(i)].append(i)
    out = []
    left_out: list[str] = []
    for doc, idx in chunks.items():
        idx.sort()
        refs = dataset.references(idx[0]) if hasattr(dataset, "references") else [dataset.summary_text(idx[0])]
        refs = [r for r in refs if r]
        if not refs:
            left_out.append(doc)
            continue
        labels = [dataset.labels(i) for i in idx]
        out.append(Document(doc, [s for i in idx for s in dataset.sentences_text(i)], refs,
                            np.concatenate(labels) if all(lab is not None for lab in labels) else None))
    split = str(getattr(dataset, "split", ""))
    if left_out:
        where = f" of split {split}" if split else ""
        if not out:
            raise UserError(f"hibert evaluate: none of the {len(chunks)} documents{where} has a reference summary: "
                            "nothing to score")
    if left_out and not getattr(dataset, "_left_out_warned", False):   # once: k-tuning reads a split ten times
        try:
            dataset._left_out_warned = True
        except AttributeError:   # a view without instance attributes warns every time
            pass
        log.warning("%d of %d documents%s have no reference summary and are left out of scoring (%s%s)",
                    len(left_out), len(chunks), where, ", ".join(map(str, left_out[:5])),
                    ", ..." if len(left_out) > 5 else "")
    record = _LEFT_OUT.get()
    if record is not None:
        record[split] = left_out      # the last call per split: tuning reads 'valid' several times
    return out


def baseline_systems(docs: list[Document]) -> dict[str, list[list[str]]]:
    """Lead-3 (the first three sentences) and, where labels exist, the extractive oracle."""
    out = {"lead3": [[d.sentences[j] for j in lead(d.sentences, 3)] for d in docs]}
    if all(d.labels is not None for d in docs):
        out["oracle"] = [[d.sentences[j] for j in oracle_from_labels(d.labels)] for d in docs]
    return out


def score_systems(docs: list[Document], systems: dict[str, list[list[str]]], n_resamples: int = 1000,
                  seed: int = 0, primary: str = "model") -> dict[str, Any]:
    """ROUGE (mean and 95% CI) of every system on the same documents, and the paired bootstrap of the
    `primary` system against each other one (F1 of the headline metrics)."""
    if not docs:
        raise UserError("hibert evaluate: no documents to score (none has a reference summary)")
    rouge = Rouge()
    refs = [d.references for d in docs]
    per_doc = {name: rouge.score_corpus(s, refs) for name, s in systems.items()}
    results = {name: summarize_scores(v, n_resamples, seed) for name, v in per_doc.items()}
    paired = {f"{primary}-{other}": {m: paired_bootstrap(per_doc[primary][m], per_doc[other][m], n_resamples, seed)
                                     for m in HEADLINE}
              for other in per_doc if primary in per_doc and other != primary}
    return {"num_documents": len(docs), "systems": results, "summaries": systems, "paired": paired,
            "per_document": {name: {m: v[m].round(4).tolist() for m in HEADLINE} for name, v in per_doc.items()},
            "doc_ids": [d.doc_id for d in docs], "multi_reference": any(len(r) > 1 for r in refs)}


# the bins of the picked-position histograms: sentence 1, 2, ..., 9 of the document, then 10 and later
POSITION_BINS = 10


def position_histograms(result: dict[str, Any], docs: list[Document]) -> dict[str, Any]:
    """Where in the document each extract's sentences come from, when the result holds the model's own picks
    (an extractive model): {"bins": ["1", ..., "10+"], "systems": {name: {"picks": n, "counts": [...],
    "share": [...]}}} for the model, Lead-3 (0, 1, 2 by construction) and, where the documents carry oracle
    labels, the oracle; {} otherwise."""
    picks = result.get("picks") or {}
    if not picks:
        return {}
    indices: dict[str, list[list[int]]] = {name: [list(p) for p in per_doc] for name, per_doc in picks.items()}
    indices["lead3"] = [lead(d.sentences, 3) for d in docs]
    if docs and all(getattr(d, "labels", None) is not None for d in docs):
        indices["oracle"] = [oracle_from_labels(d.labels) for d in docs]
    systems = {}
    for name, per_doc in indices.items():
        counts = [0] * POSITION_BINS
        for doc_picks in per_doc:
            for j in doc_picks:
                counts[min(int(j), POSITION_BINS - 1)] += 1
        total = sum(counts)
        systems[name] = {"picks": total, "counts": counts,
                         "share": [round(c / total, 4) if total else 0.0 for c in counts]}
    return {"bins": [str(i + 1) for i in range(POSITION_BINS - 1)] + [f"{POSITION_BINS}+"], "systems": systems}


def position_lines(positions: dict[str, Any], shown: tuple[str, ...] = ("model", "oracle")) -> list[str]:
    """report.md's table of the picked positions: % of each system's picks at sentence 1, 2, ..., 10+."""
    rows = [(name, positions["systems"][name]) for name in shown if name in positions.get("systems", {})]
    if not rows:
        return []
    lines = ["Picked sentence position (% of each system's picked sentences at sentence 1, 2, ... of the "
             "document; Lead-3 takes 1, 2, 3):", "",
             "| picked sentence position | " + " | ".join(positions["bins"]) + " |",
             "|---|" + "---|" * len(positions["bins"])]
    for name, h in rows:
        lines.append(f"| {md(name)} ({h['picks']} picks) | " + " | ".join(f"{100 * x:.0f}" for x in h["share"]) + " |")
    return lines


def md(text: Any) -> str:
    """Text from documents, models or the command line as Markdown shows it, never as markup: <, > and & as
    entities (no <script>, <img onerror>, <iframe> or an unclosed <!-- hiding the rest of the report), | escaped
    (a table cell stays one cell), the text on one line."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def _on_off(v: Any) -> Any:
    return ("on" if v else "off") if isinstance(v, bool) else v


def meta_lines(meta: dict[str, Any]) -> list[str]:
    """report.md's list of the meta: notes first (as a block of their own, see `notes_lines`), settings that are
    dicts as nested lists (`generation`), empty lists and dicts left out (`compared_with: []`), the extract's
    selection (`k`, `trigram_blocking`, whether flags gave it: `selection_given`) as one line, `reads_sentences`
    only where no `reads` line says it."""
    lines = []
    selection = [f"k={meta['k']} sentences"] if "k" in meta else []
    if "trigram_blocking" in meta:
        selection.append(f"trigram blocking {_on_off(meta['trigram_blocking'])}")
    if meta.get("selection_given"):
        selection.append("as the command line's flags set them")
    for key, value in meta.items():
        if key == "notes" or (isinstance(value, (list, tuple, dict)) and not value) or \
                (key == "reads_sentences" and "reads" in meta):
            continue
        if key in ("k", "trigram_blocking", "selection_given"):
            if selection:
                where = any("selection" in str(n).lower() for n in meta.get("notes") or [])
                lines.append("- selection: " + ", ".join(selection)
                             + (" (where these come from: see the notes above)" if where else ""))
                selection = []
            continue
        if isinstance(value, dict):
            lines.append(f"- {key}:")
            lines += [f"  - {md(k)}: {md(meta_text(v))}" for k, v in value.items()]
        else:
            lines.append(f"- {md(key)}: {md(meta_text(value))}")
    return lines


def notes_lines(meta: dict[str, Any]) -> list[str]:
    """The meta's notes as a quoted block, each one a paragraph: what a reader must know before the numbers."""
    lines = []
    for note in meta.get("notes") or []:
        lines += [f"> **Note:** {md(note)}", ">"]
    return lines[:-1] + [""] if lines else []


def chart_title(out_dir: Path, meta: dict[str, Any], num_documents: int) -> str:
    """rouge.png's title: the run (the report directory's run directory, `<run>/report-<split>`, else the
    report directory itself), its task and the split."""
    out_dir = Path(out_dir).resolve()
    run = out_dir.parent.name if out_dir.name.startswith("report-") else out_dir.name
    task = f" ({meta['task']})" if meta.get("task") else ""
    return f"{run}{task}: ROUGE on {meta.get('split', '?')}, {num_documents} documents (95% CI)"


def write_report(out_dir: Path, result: dict[str, Any], docs: list[Document], meta: dict[str, Any]) -> dict[str, Path]:
    """report.json, report.md, rouge.png and the output viewer (viewer.html); returns their paths."""
    import matplotlib  # lazy: ~0.4 s, and the backend must be chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    systems = result["systems"]
    positions = position_histograms(result, docs)
    payload = {"meta": meta, "num_documents": result["num_documents"], "scores": systems,
               "paired": result.get("paired", {}), "abstractiveness": result.get("abstractiveness", {}),
               **({"positions": positions} if positions else {}),
               # the source sentences each system picked, per document (an extractive model's own picks)
               **({"picks": result["picks"]} if result.get("picks") else {}),
               # the model's summary of each document (its sentences), in the order of per_document's doc_ids
               **({"outputs": result["outputs"]} if result.get("outputs") else {}),
               "per_document": {"doc_ids": result.get("doc_ids", []), **result.get("per_document", {})},
               "rouge_implementation": "rouge-score (Porter stemmer on; ROUGE-Lsum on newline-split sentences); "
                                       "not the Perl ROUGE-1.5.5",
               "multi_reference": "max over references per document" if result["multi_reference"] else "single"}
    (out_dir / "report.json").write_text(json.dumps(payload, indent=1))

    lines = [f"# {meta.get('task', 'summarization').capitalize()} summarization report", "",
             *notes_lines(meta),
             f"- documents: {result['num_documents']}",
             *meta_lines(meta),
             f"- ROUGE: {payload['rouge_implementation']}; F1 x 100 with bootstrap 95% CI over documents",
             "", "| system | " + " | ".join(m.replace("_f", "") for m in HEADLINE) + " |",
             "|---|" + "---|" * len(HEADLINE)]
    for name, sc in systems.items():
        cells = [f"{sc[m]['mean']:.2f} [{sc[m]['low']:.2f}, {sc[m]['high']:.2f}]" for m in HEADLINE]
        lines.append(f"| {md(name)} | " + " | ".join(cells) + " |")
    if result.get("paired"):
        lines += ["", "Paired bootstrap over the same documents (difference of F1, 95% CI, two-sided p):", "",
                  "| pair | " + " | ".join(m.replace("_f", "") for m in HEADLINE) + " | ROUGE-1 reads |",
                  "|---|" + "---|" * (len(HEADLINE) + 1)]
        for pair, by_metric in result["paired"].items():
            cells = [f"{by_metric[m]['diff']:+.2f} [{by_metric[m]['low']:+.2f}, {by_metric[m]['high']:+.2f}] "
                     + format_p(by_metric[m]["p_value"], by_metric[m]["resamples"]) for m in HEADLINE]
            r1 = by_metric[HEADLINE[0]]
            lines.append(f"| {md(pair)} | " + " | ".join(cells) + f" | {verdict(r1['low'], r1['high'])} |")
        lines += ["", ONE_SEED]
    if result.get("abstractiveness"):
        cols = list(next(iter(result["abstractiveness"].values())))
        lines += ["", "What the summaries are made of (novel n-grams: % of the summary's n-grams absent from the "
                  "source; repeated 3-grams: % repeating an earlier 3-gram of the same summary):", "",
                  "| system | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for name, stats in result["abstractiveness"].items():
            lines.append(f"| {md(name)} | " + " | ".join(f"{stats[c]:.1f}" for c in cols) + " |")
    if positions:
        lines += ["", *position_lines(positions)]
    lines += ["", "## Examples", ""]
    for i in range(min(3, len(docs))):
        lines += [f"### {md(docs[i].doc_id)}", ""]
        for name, summaries in result["summaries"].items():
            lines += [f"**{md(name)}:** " + md(" ".join(summaries[i])), ""]
        lines += ["**reference:** " + md(" ".join(docs[i].references[0])), ""]
    (out_dir / "report.md").write_text("\n".join(lines))

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(systems)
    width = 0.8 / max(1, len(names))
    x = np.arange(len(HEADLINE))
    for j, name in enumerate(names):
        means = np.array([systems[name][m]["mean"] for m in HEADLINE])
        err = np.array([[means[i] - systems[name][m]["low"], systems[name][m]["high"] - means[i]]
                        for i, m in enumerate(HEADLINE)]).T
        ax.bar(x + j * width, means, width, yerr=err, capsize=3, label=name)
    ax.set_xticks(x + width * (len(names) - 1) / 2, [m.replace("_f", "") for m in HEADLINE])
    ax.set_ylabel("F1 (x100)")
    ax.set_title(chart_title(out_dir, meta, result["num_documents"]), fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "rouge.png", dpi=120)
    plt.close(fig)
    html = write_viewer(out_dir, {**result, "positions": positions}, docs, meta)
    return {"json": out_dir / "report.json", "md": out_dir / "report.md", "png": out_dir / "rouge.png",
            "html": html}


def split_name(item: str) -> tuple[str, str]:
    """`NAME=PATH` -> (NAME, PATH) at the first "=", when NAME is not empty and holds no "/" (a path may hold "=":
    `lr=runs/sweep/lr=1e-4`, `runs/sweep/lr=1e-4`); otherwise ("", item)."""
    name, eq, path = item.partition("=")
    return (name, path) if eq and name and "/" not in name else ("", item)


def find_report(path: str, split: str) -> Path | None:
    """The report.json that PATH names: the file, its directory, or a run directory's report-<split>/."""
    p = Path(path)
    for cand in (p, p / "report.json", p / f"report-{split}" / "report.json"):
        if cand.is_file():
            return cand.resolve()
    return None


def unique_labels(dirs: list[Path], suffixes: list[str] | None = None, taken: Collection[str] = ()) -> list[str]:
    """Names for unnamed runs: each run directory's name (+ its suffix), with as many parent directories in front
    as it takes to tell it from the others and from `taken` (exp1/ext and exp2/ext, not two 'ext')."""
    suffixes = suffixes or [""] * len(dirs)
    depth = [1] * len(dirs)
    while True:
        labels = ["/".join(d.parts[-n:]) + x for d, n, x in zip(dirs, depth, suffixes)]
        clash = [i for i, lab in enumerate(labels) if lab in taken or labels.count(lab) > 1]
        grow = [i for i in clash if depth[i] < len(dirs[i].parts) - 1]
        if not grow:
            if clash:   # two reports of one run directory (report-test, report-test-nocap): no path tells them apart
                raise UserError(f"hibert: two reports would both be named {labels[clash[0]]!r}: name them "
                                "(NAME=PATH; the same NAME pools them as seeds in `hibert compare`)")
            return labels
        for i in grow:
            depth[i] += 1


# rows every summary report pairs the model with: a --compare name equal to one would replace that pair
RESERVED = ("model", "lead3", "oracle")


def compared_reports(paths: list[str], split: str) -> dict[str, dict[str, Any]]:
    """`--compare [NAME=]PATH`: another run's report (report.json, its directory, or a run dir holding
    report-<split>/report.json) whose per-document model scores are paired with this model's. An unnamed report
    is named after its run directory (with its parents where two would share a name); a report named twice, two
    reports under one NAME or a NAME of a row of this report are UserErrors."""
    found: list[tuple[str, Path, str]] = []
    for item in paths:
        name, path = split_name(item)
        cand = find_report(path, split)
        if cand is None:
            raise UserError(f"hibert: report {item!r}: no report.json there (run `hibert evaluate` for that run "
                            "first)")
        if any(cand == c for _, c, _ in found):
            raise UserError(f"hibert evaluate: --compare {item!r}: {cand} is listed twice")
        found.append((name, cand, item))
    named = [n for n, _, _ in found if n]
    for n in named:
        if named.count(n) > 1:
            raise UserError(f"hibert evaluate: --compare: two reports are named {n!r} (pairs take one each; "
                            "`hibert compare` pools seeds)")
        if n in RESERVED:
            raise UserError(f"hibert evaluate: --compare {n}=...: {n!r} is a row of this report; pick another name")
    unnamed = [i for i, (n, _, _) in enumerate(found) if not n]
    labels = unique_labels([found[i][1].parent.parent for i in unnamed], taken={*named, *RESERVED})
    names = [n for n, _, _ in found]
    for i, label in zip(unnamed, labels):
        names[i] = label
    return {n: json.loads(c.read_text()) for n, (_, c, _) in zip(names, found)}


def check_compare_names(reports: dict[str, dict[str, Any]], systems: Collection[str]) -> None:
    """A --compare name equal to a system of this report would overwrite its model-<name> pair: refuse it."""
    clash = sorted(set(reports) & set(systems))
    if clash:
        raise UserError(f"hibert evaluate: --compare {', '.join(clash)}: the name of a row of this report; "
                        "give that report another NAME=")


def pair_with_reports(result: dict[str, Any], reports: dict[str, dict[str, Any]], n_resamples: int) -> None:
    """Add `model-<name>` paired differences against other runs' per-document scores (same documents)."""
    check_compare_names(reports, [p.removeprefix("model-") for p in result.get("paired", {})])
    ours = dict(zip(result["doc_ids"], range(len(result["doc_ids"]))))
    for name, rep in reports.items():
        theirs = rep.get("per_document", {})
        ids = theirs.get("doc_ids", [])
        common = [d for d in ids if d in ours]
        if not common or "model" not in theirs:
            raise UserError(f"hibert evaluate: --compare {name}: its report shares no documents with this one")
        if len(common) != len(ours):
            log.warning("--compare %s: paired over the %d documents both reports hold (of %d)", name, len(common),
                        len(ours))
        a_idx = [ours[d] for d in common]
        b_idx = [ids.index(d) for d in common]
        result["paired"][f"model-{name}"] = {
            m: paired_bootstrap(np.asarray(result["per_document"]["model"][m])[a_idx] * 1.0,
                                np.asarray(theirs["model"][m])[b_idx] * 1.0, n_resamples)
            for m in HEADLINE}


def score_lines(result: dict, paths: dict) -> list[str]:
    """What `hibert evaluate` prints for a summary report: each system's ROUGE with its CI, the paired
    differences, and where the report is."""
    lines = []
    for name, sc in result["systems"].items():
        lines.append(f"{name:8s} " + "  ".join(f"{m.replace('_f', '')}={sc[m]['mean']:.2f}"
                                               f"[{sc[m]['low']:.2f},{sc[m]['high']:.2f}]"
                                               for m in ("rouge1_f", "rouge2_f", "rougeL_f")))
    for pair, by_metric in result.get("paired", {}).items():
        d = by_metric["rouge1_f"]
        lines.append(f"{pair:16s} R1 {d['diff']:+.2f} [{d['low']:+.2f},{d['high']:+.2f}] "
                     f"{format_p(d['p_value'], d['resamples'])} (paired: {verdict(d['low'], d['high'])})")
    lines.append(f"report: {paths['md']}  chart: {paths['png']}")
    if "html" in paths:
        lines.append(f"viewer: {paths['html']}  (open in a browser: sources, picks, copied spans, worst documents first)")
    return lines
