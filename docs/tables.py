"""Render the generated tables of README.md and docs/*.md from committed results files.

A generated table sits between two markers; everything between them is this script's:

    <!-- table: docs/results/pretrain-gain-cnndm.json rouge-seeds -->
    ...
    <!-- /table -->

Pages: README.md, docs/*.md, each folder's README.md and docs/results/README.md. The first word names the results
file (relative to the repository; several joined by "+" for a benchmark view that reads more than one), the second
the view. The block's first line under the table says what made the numbers, as the file records them. A `hibert
compare --results` file says it once per page: its first table on the page carries the provenance line (the models'
commit, the script docs/results/make_*.sh that names the file in its `--results`, else the file's full command; the
date, the code's commit and tree), every later table of the same file on that page says "Same results file as
above". Each file's full command is listed by the `provenance` view (docs/results/README.md). A results file's
generated prose is wrapped at 120 characters.

    python docs/tables.py            rewrite every block in place
    python docs/tables.py --check    exit 1 with a diff when a block differs from what this script renders

Views of `hibert compare --results` files (schema hibert-results/1, docs/results/README.md):
  rouge-seeds   systems x metrics: mean [95% CI] ± sd of the per-seed means (the per-seed means)
  paired        each system against the reference: difference [95% CI] p, and what the interval allows one to
                say ("no measurable difference" where it crosses 0, else "higher" / "lower")
  positions     % of each extracting system's picks at sentence 1, 2, ..., 10+ (its seeds' reports summed)
  training      each trained system's validation perplexity (else loss) at its last step and its outputs' mean
                words, over seeds
  pretraining   the encoders the systems were finetuned from, each once: stage, init, steps, the pretraining
                objective's validation perplexity at the last step, the commit
  provenance    no table: per results file (its source may be a glob, `docs/results/*.json`, which reads every
                hibert-results/1 file there), the provenance line and the full `hibert compare` command
Views of benchmark JSON (benchmarks/results/*.json): the names in BENCH_VIEWS, each a list of rows (a path into
the file) and columns (a key under the row and its format), rendered by one generic renderer. A path is dotted
keys, list positions or `key=value&key=value` (the list's element whose fields are those); a row or a column given
as a tuple of paths reads a tuple (a row that joins two objects of the file; a cell of two values, as a ratio).
"""
from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import shlex
import statistics
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hibert.finetune.evaluation.rouge import format_p, verdict
from hibert.finetune.results_file import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/*.md", "*/README.md",   # the folders' READMEs quote benchmarks too
         "docs/*/README.md")                          # docs/results/README.md lists each results file's command
BLOCK = re.compile(r"(?P<open><!-- table: (?P<source>\S+) (?P<view>\S+) -->\n)(?P<body>.*?)(?P<close><!-- /table -->)",
                   re.DOTALL)
METRIC_NAMES = {"rouge1_f": "R1", "rouge2_f": "R2", "rougeL_f": "RL", "rougeLsum_f": "RLsum"}


class TableError(Exception):
    """A block that cannot be rendered: a missing file, an unknown view, a file of another schema."""


def short(commit: str | None) -> str:
    return commit[:7] if commit and commit != "unknown" else "an unrecorded commit"


def metric_name(metric: str) -> str:
    return METRIC_NAMES.get(metric) or (f"L'={metric.split('@', 1)[1]}" if metric.startswith("recall@") else metric)


def signed(x: float) -> str:
    return f"{x:+.2f}".replace("-", "−")


def count(n: int) -> str:
    return f"{n:,}"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


# ------------------------------------------------------------------ hibert compare --results files

WIDTH = 120   # generated prose (provenance lines, notes) is wrapped to this many characters
MAKE_SCRIPTS = "docs/results/make_*.sh"
RESULTS_ARG = re.compile(r"""--results\s+(["']?)(?P<path>[^\s"']+)\1""")
SHELL_VAR = re.compile(r"\$\{?\w+\}?")


def make_script(root: Path, source: str) -> str | None:
    """The script of docs/results/ whose `hibert compare ... --results PATH` writes `source`: PATH's file name,
    its shell variables (`$set`, `${LABELS}`) read as any text; where several match, the one whose name has the
    most literal characters (`cnndm40k-$LABELS-$NAME.json` before `cnndm40k-$LABELS.json`)."""
    name = Path(source).name
    best: tuple[int, str] | None = None
    for script in sorted(root.glob(MAKE_SCRIPTS)):
        try:
            text = script.read_text(encoding="utf-8")
        except OSError:
            continue
        for m in RESULTS_ARG.finditer(text):
            pattern = Path(m["path"]).name
            parts = SHELL_VAR.split(pattern)
            if re.fullmatch("[^/]+".join(map(re.escape, parts)), name):
                literal = sum(map(len, parts))
                if best is None or literal > best[0]:
                    best = (literal, str(script.relative_to(root)))
    return best[1] if best else None


def made_line(results: dict[str, Any], source: str, script: str | None = None, listed: bool = True) -> str:
    """Which commit's models and what made the numbers (the make script, else the file's command); when, and
    from which code and tree. `listed`: say where the full command is (not in the listing itself)."""
    made = results["made"]
    commit = results.get("model_commit")
    models = (f"commit {short(commit)}" if commit else
              "several commits (" + ", ".join(short(c) for c in results["model_commits"]) + ")")
    tree = {True: "a clean tree", False: "uncommitted changes", None: "its tree unknown"}[made.get("clean")]
    if script:
        where = ", which records the full `hibert compare` command, listed in docs/results/README.md" if listed else ""
        return (f"Made at {models} by `bash {script}` ({made['date']}; the code at {short(made['commit'])}, {tree}; "
                f"{source}{where}).")
    where = f" in `{made['cwd']}`" if made.get("cwd") not in (None, ".") else ""
    return (f"Made at {models} by `{made['command']}`{where} ({made['date']}; the code at {short(made['commit'])}, "
            f"{tree}; {source}).")


def same_file_line(source: str) -> str:
    """Under a later table of a results file whose provenance line a table above on the page carries."""
    return f"Same results file as above ({source})."


def wrap(text: str) -> list[str]:
    """A paragraph of generated prose in lines of at most WIDTH characters (a longer word stays whole)."""
    return textwrap.wrap(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def shell_lines(command: str, width: int = 100) -> list[str]:
    """A recorded command as shell lines of about `width` characters, continued with a backslash; the command
    as recorded, on one line, where its words do not split and rejoin to it."""
    try:
        words = shlex.split(command)
    except ValueError:
        return [command]
    if " ".join(shlex.quote(w) for w in words) != command:
        return [command]
    units: list[str] = []   # an option and its value stay on one line
    for word in map(shlex.quote, words):
        if units and units[-1].startswith("--") and " " not in units[-1] and not word.startswith("-"):
            units[-1] += " " + word
        else:
            units.append(word)
    lines, line = [], ""
    for word in units:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


def seed_list(system: dict[str, Any]) -> str:
    seeds = [r.get("seed") for r in system["runs"]]
    return "/".join(map(str, seeds)) if all(s is not None for s in seeds) else str(system["seeds"])


def rouge_seeds(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    metrics = results["metrics"]
    rows = []
    for name, system in results["systems"].items():
        cells = []
        for m in metrics:
            sc = system["scores"][m]
            cell = f"{sc['mean']:.2f} [{sc['low']:.2f}, {sc['high']:.2f}]"
            if sc.get("seed_sd") is not None:
                cell += f" ± {sc['seed_sd']:.2f} (" + " / ".join(f"{x:.2f}" for x in sc["seed_means"]) + ")"
            cells.append(cell)
        rows.append([name, count(system["documents"]), seed_list(system), *cells])
    unit = "clusters" if results.get("kind") == "unit rankings" else "documents"
    return table(["system", unit, "seeds", *map(metric_name, metrics)], rows), [
        (f"Mean over seeds and {unit} [95% CI over {unit}] ± sd of the per-seed means (the per-seed means, in the "
         "order of the seeds column).")]


def paired(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    metrics = results["metrics"]
    rows = []
    for pair in results["paired"].values():
        cells = [f"{signed(pair[m]['diff'])} [{signed(pair[m]['low'])}, {signed(pair[m]['high'])}] "
                 + format_p(pair[m]["p_value"], pair[m]["resamples"]) for m in metrics]
        first = pair[metrics[0]]
        rows.append([f"{pair['system']} − {pair['reference']}", count(pair["documents"]),
                     "/".join(map(str, pair["seeds"])), *cells, verdict(first["low"], first["high"])])
    unit = "clusters" if results.get("kind") == "unit rankings" else "documents"
    return table(["pair", unit, "seeds", *map(metric_name, metrics), f"{metric_name(metrics[0])} reads"], rows), [
        (f"Paired bootstrap over {unit} and seeds: difference, 95% CI, two-sided p; an interval that crosses 0 "
         "reads \"no measurable difference\".")]


def positions(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Where each extracting system's picks sit in the documents: % of its picks at sentence 1, 2, ..., 10+."""
    rows, bins = [], None
    for name, system in results["systems"].items():
        pos = system.get("positions")
        if not pos:
            continue
        bins = bins or pos["bins"]
        rows.append([name, count(pos["picks"]), *(f"{100 * c / max(pos['picks'], 1):.0f}" for c in pos["counts"])])
    if not rows:
        raise TableError("no system of this results file records the positions of its picks")
    return table(["system", "picks", *(f"sentence {b}" for b in bins)], rows), [
        "% of each system's picked sentences at each position of the document, over its seeds' reports."]


def spread(values: list[float], digits: int | None = None) -> str:
    """One seed's value, or mean ± sd of the seeds' values (the values); `digits` decimals, by default whole
    numbers where the values are in the hundreds (a perplexity), else two."""
    digits = digits if digits is not None else 0 if max(abs(x) for x in values) >= 100 else 2

    def num(x: float) -> str:
        return f"{x:.{digits}f}"

    if len(values) == 1:
        return num(values[0])
    return f"{num(statistics.mean(values))} ± {num(statistics.stdev(values))} (" + " / ".join(map(num, values)) + ")"


def training(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Beside the scores: each trained system's validation loss at its last step (`last_valid`: the perplexity
    where the model has one, else the loss; the validation ROUGE of a few decoded documents is left to the test
    scores) and its outputs' mean words, over its seeds."""
    systems = results["systems"]
    kept = {m for s in systems.values() for r in s["runs"] for m in r.get("last_valid", {})}
    metrics = ["valid_ppl"] if "valid_ppl" in kept else ["valid_loss"] if "valid_loss" in kept else []
    words = any("words" in r for s in systems.values() for r in s["runs"])
    timed = any("seconds" in r for s in systems.values() for r in s["runs"])
    rows = []
    for name, system in systems.items():
        runs = system["runs"]
        cells = [spread([r["last_valid"][m] for r in runs if m in r.get("last_valid", {})]) if all(
            m in r.get("last_valid", {}) for r in runs) else "" for m in metrics]
        if words:
            cells.append(spread([r["words"] for r in runs]) if all("words" in r for r in runs) else "")
        if timed:
            cells.append(minutes(runs))
        if any(cells):
            rows.append([name, seed_list(system), *cells])
    if not rows:
        raise TableError("no system of this results file records validation metrics or words (a file written "
                         "before they were kept: rerun its `hibert compare --results`)")
    head = ([f"{m.removeprefix('valid_')} (valid, last step)" for m in metrics] + (["words"] if words else [])
            + (["training minutes"] if timed else []))
    return table(["system", "seeds", *head], rows), [
        ("Validation at each model's last training step and its outputs' mean words on the test "
         "documents: one seed's value, or mean ± sd over the seeds (each seed's value, in the seeds column's "
         "order); an untrained baseline has no validation metrics. Training minutes: each run's MLflow run, start "
         "to end (set-up and export included; a requeued run's, its time in the queue too).")]


def minutes(runs: list[dict[str, Any]]) -> str:
    """Each run's wall time in minutes (`seconds`, from its MLflow run), over the runs; empty where one has none."""
    return spread([r["seconds"] / 60 for r in runs], digits=1) if all("seconds" in r for r in runs) else ""


def pretraining(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The encoders the systems were finetuned from (each run's `encoder`, from its init copy), each counted
    once however many finetunings share it: stage, the init it continued, its last step, the pretraining
    objective's validation perplexity there (else loss), and the commit it was trained at."""
    rows = []
    for name, system in results["systems"].items():
        runs = [r for r in system["runs"] if r.get("row") in ("model", "ranker")]
        if not runs:
            continue
        if not any("encoder" in r for r in runs):
            rows.append([name, "none (random init)", "", "", "", "", "", ""])
            continue
        if not all("encoder" in r for r in runs):
            raise TableError(f"system {name!r} mixes runs with and without a pretrained encoder")
        # one encoder per MLflow run; without a run id (tracking off), per what the export says of itself
        encoders = list({r["encoder"]["run"] or json.dumps(r["encoder"], sort_keys=True): r["encoder"]
                         for r in runs}.values())
        metric = next((m for m in ("valid_ppl", "valid_loss") if all(m in e["last_valid"] for e in encoders)), None)
        one = [" / ".join(dict.fromkeys(str(e[key]) for e in encoders)) for key in ("stage", "init", "step")]
        rows.append([name, str(len(encoders)), *one,
                     "" if metric is None else spread([e["last_valid"][metric] for e in encoders])
                     + ("" if metric == "valid_ppl" else " (loss)"),
                     minutes(encoders), " / ".join(dict.fromkeys(short(e["model_commit"]) for e in encoders))])
    if not any(r[1] != "none (random init)" for r in rows):
        raise TableError("no system of this results file records its pretrained encoder (a file written before "
                         "encoders were kept: rerun its `hibert compare --results`)")
    return table(["system", "encoders", "stage", "continued from", "steps", "ppl (valid, last step)",
                  "minutes (this stage)", "pretrained at"], rows), [
        ("The encoders each system was finetuned from, each counted once (finetuning seeds share one): the masked-"
         "sentence objective's validation perplexity at the encoder's last step, one encoder's value or mean ± sd "
         "over the encoders (each one's value); minutes: the stage's MLflow run, start to end.")]


# a view: (the table's lines, the notes under the line saying what made it)
RESULT_VIEWS: dict[str, Callable[[dict[str, Any]], tuple[list[str], list[str]]]] = {
    "rouge-seeds": rouge_seeds, "paired": paired, "positions": positions, "training": training,
    "pretraining": pretraining}


# ------------------------------------------------------------------ benchmark JSON

def millions(x: float) -> str:
    return f"{x / 1e6:#.3g}".rstrip(".") + "M"      # 1.54M, 33.0M, 158M


def fixed(digits: int, unit: str = "") -> Callable[[float], str]:
    return lambda x: f"{x:.{digits}f}{unit}"


def grouped(x: float) -> str:
    return f"{x:,.0f}"                               # 435,583


@dataclass(frozen=True)
class BenchView:
    """A table of benchmark JSON: `rows` are (label, file index, path to the row's object), `columns` (header,
    path under the row's object, format); a tuple of paths reads a tuple. `command`: the script and the `args` keys
    it shows."""
    corner: str
    rows: tuple[tuple[str, int, str | tuple[str, ...]], ...]
    columns: tuple[tuple[str, str | tuple[str, ...], Callable[[Any], str]], ...]
    script: str = ""
    command: tuple[str, ...] = ()

    def render(self, files: list[dict[str, Any]]) -> list[str]:
        return table([self.corner, *(c[0] for c in self.columns)],
                     [[label, *(fmt(pick(pick(files[i], path), key)) for _, key, fmt in self.columns)]
                      for label, i, path in self.rows])

    def command_line(self, data: dict[str, Any]) -> str | None:
        machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
        for recorded in (data.get("command"), machine.get("command")):   # as it ran (workload.run_command)
            if isinstance(recorded, str):
                return recorded
        args = data.get("args")
        if not self.script or not isinstance(args, dict):
            return None
        argv = ["python", self.script]
        for key in self.command:
            value = args.get(key)
            if str(value) in ("False", "None", "", "[]"):
                continue
            if isinstance(value, list):            # nargs, in a JSON list: --workers 0 1 2
                values = [str(v) for v in value]
            elif str(value).startswith("["):       # a comma option the script split, recorded as str(list)
                values = [",".join(str(v) for v in ast.literal_eval(value))]
            else:
                values = [] if str(value) == "True" else [str(value)]
            argv += [f"--{key.replace('_', '-')}", *values]
        return " ".join(argv)


def lookup(obj: Any, path: str) -> Any:
    for part in path.split(".") if path else []:
        if isinstance(obj, list) and "=" in part:
            want = dict(cond.split("=", 1) for cond in part.split("&"))
            obj = next((x for x in obj if all(str(x.get(k)) == v for k, v in want.items())), None)
            if obj is None:
                raise KeyError(part)
        else:
            obj = obj[int(part)] if isinstance(obj, (list, tuple)) else obj[part]
    return obj


def pick(obj: Any, path: str | tuple[str, ...]) -> Any:
    return tuple(lookup(obj, p) for p in path) if isinstance(path, tuple) else lookup(obj, path)


# bench_generate.py --profile: (the page's name, the profiler's category in the file)
PROFILE_ROWS = (("encoder pass", "encoder pass"), ("output projection (32,000 columns)", "output projection (V columns)"),
                ("decoder linear layers", "linear layers"),
                ("cross-attention matmuls (q K^T, p V)", "cross-attention matmuls (q K^T, p V)"),
                ("self-attention (SDPA)", "fused attention (SDPA)"), ("log-softmax, softmax", "log-softmax and softmax"),
                ("copies, gathers", "copies, gathers, cache reorder"),
                ("masks, fills, elementwise", "masks, fills, elementwise"),
                ("views, reshapes, other small ops", "views, reshapes, other small ops"),
                ("outside operators (Python, dispatch)", "outside operators (Python, dispatch)"),
                ("wall, profiler off", "wall (profiler off)"))
GENERATE_ARGS = ("device", "dtype", "size", "batch", "cross", "profile", "skip")
OVERLAP_KEYS = ("tokens_per_s_no_overlap", "efficiency_no_overlap", "tokens_per_s_overlap", "efficiency_overlap")


def overlap_rates(v: tuple[float, float, float, float]) -> str:
    """project_scaling.py's tokens/s without and with overlap, each with the compute's share of its step where
    communication takes any; one rate where nothing overlaps (one GPU, ZeRO-1)."""
    def rate(tokens: float, share: float) -> str:
        return millions(tokens) + (f" ({share:.0%})" if share < 0.995 else "")
    return rate(v[0], v[1]) if v[0] == v[2] else f"{rate(v[0], v[1])} / {rate(v[2], v[3])}"


GIGA_CM_WORDS = 2_854e6   # Zhang et al. 2019, §4.1 (as benchmarks/workload.py)
NODE_CORES = (32, 16 * 32)


@dataclass(frozen=True)
class PrepProjection(BenchView):
    """GIGA-CM's prep cost from two measurements: the whole of prep per core at the largest corpus of
    bench_scale.py (with the spaCy-variant segmenter) and both segmenters alone (bench_segment.py). With the
    neural segmenter each word costs prep's time less the spaCy variant's segmentation plus the neural one's."""

    def render(self, files: list[dict[str, Any]]) -> list[str]:
        scale, segment = files
        size = max(scale["sizes"], key=lambda k: scale["sizes"][k]["prep"][0]["words"])
        prep = scale["sizes"][size]["prep"][0]["words_per_s_per_core"]
        seg = {name: row["words_per_s_per_core"] for name, row in segment["rows"].items()}
        spacy = next(v for k, v in seg.items() if k.startswith("spacy"))
        rows = []
        for name, rate in seg.items():
            whole = prep if rate == spacy else 1 / (1 / prep - 1 / spacy + 1 / rate)
            core_h = GIGA_CM_WORDS / whole / 3600
            rows.append([name, f"{whole:,.0f}", f"{core_h:.1f}",
                         *(duration(core_h / cores) for cores in NODE_CORES)])
        return table([self.corner, "words/s/core, whole of prep", "core-hours",
                      *(f"{c} cores" for c in NODE_CORES)], rows)


def duration(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.1f} min"


# bench_generate.py's ratios: (the page's name, the key under `ratios`); a file holds those its run measured
GENERATE_RATIOS = (
    ("batch 16 over one document at a time (summary tokens/s)", "batch_speedup"),
    ("the same, decoding alone (encoder excluded)", "batch_speedup_decode_only"),
    ("KV cache over recomputing the prefix (tokens/s)", "cache_speedup"),
    ("PHT cross-attention over flat (time)", "pht_time_ratio"),
    ("VHT cross-attention over flat (time)", "vht_time_ratio"),
    ("ours over the anchors' search, batch 16 (summary tokens/s)", "speedup_over_anchor_search"),
    ("peak memory, beam 5 over beam 1: allocated tensors", "memory_ratio_tensors"),
    ("the same, decoding phase (from the end of the encoder pass)", "memory_ratio_tensors_decode_phase"),
    ("peak memory, beam 5 over beam 1: process RSS", "memory_ratio_rss"),
    ("the same, decoding phase", "memory_ratio_rss_decode_phase"),
    ("the anchors' peak RSS over ours, beam 5", "anchor_memory_ratio"))


@dataclass(frozen=True)
class GenerateRatios(BenchView):
    """bench_generate.py's ratios, each with its rounds' range (the ratio is their median) and its target where
    the script sets one; the ratios the run did not measure (skipped parts) are left out."""

    def render(self, files: list[dict[str, Any]]) -> list[str]:
        ratios = files[0]["ratios"]
        rows = []
        for label, key in GENERATE_RATIOS:
            if key not in ratios:
                continue
            r = ratios[key]
            rounds = r.get("rounds") or []
            spread = f"{min(rounds):.2f}–{max(rounds):.2f}" if len(rounds) > 1 else ""
            target = f"{r['target']} ({'met' if r.get('met') else 'not met'})" if r.get("target") else ""
            rows.append([label, f"{r['value']:.2f}×", spread, target])
        return table([self.corner, "ratio", "rounds", "target"], rows)


MDS_ENCODERS = (("hierarchical (HIBERT per unit + global layers)", "hierarchical"),
                ("the same units as one HIBERT document", "hibert-flat"),
                ("flat token transformer (full self-attention)", "token-flat"))


@dataclass(frozen=True)
class MdsGrowth(BenchView):
    """bench_mds.py: seconds and peak memory of one training step at each input length, and the growth exponent
    of each (a least-squares fit of log cost on log length)."""

    def render(self, files: list[dict[str, Any]]) -> list[str]:
        data = files[0]
        lengths = data["lengths"]
        rows = [[label,
                 *(f"{data['rows'][f'{key}@{n}']['seconds']:.2f} s" for n in lengths),
                 f"n^{data['growth_exponent'][key]['time']:.2f}",
                 *(f"{data['rows'][f'{key}@{n}']['peak_mib']:.0f} MiB" for n in lengths),
                 f"n^{data['growth_exponent'][key]['memory']:.2f}"] for label, key in MDS_ENCODERS]
        return table([self.corner, *(f"step @ {n:,}" for n in lengths), "time grows",
                      *(f"peak @ {n:,}" for n in lengths), "memory grows"], rows)


BENCH_VIEWS: dict[str, BenchView] = {
    "scale-prep": BenchView(
        corner="corpus",
        rows=tuple((size.replace("MB", " MB").replace("GB", " GB"), 0, f"sizes.{size}.prep.0")
                   for size in ("10MB", "100MB", "1GB")),
        columns=(("words", "words", millions), ("shards", "shards", str),
                 ("words/s/core", "words_per_s_per_core", grouped),
                 ("peak RSS (largest process)", "peak_rss_mb", fixed(0, " MB")),
                 ("merge alone", "merge_s", fixed(1, " s")),
                 ("bytes/token on disk", "bytes_per_token", lambda x: f"{x:.2f}"))),
    "scale-loader": BenchView(
        corner="shards",
        rows=tuple((f"{int(n):,}", 0, f"loader.{n}") for n in ("10", "1000", "10000")),
        columns=(("chunks", "chunks", count), ("open", "open_s", fixed(3, " s")),
                 ("plan", "plan_s", fixed(3, " s")), ("first batch", "first_batch_s", fixed(3, " s")),
                 ("resume (middle batch)", "resume_batch_s", fixed(3, " s")),
                 ("merge", "prep.merge_s", fixed(1, " s")), ("manifest", "manifest_mb", fixed(1, " MB")),
                 ("held by an open dataset (parsing peak)", ("open_heap_mb", "open_heap_peak_mb"),
                  lambda v: f"{v[0]:.2f} MB ({v[1]:.1f} MB)"),
                 ("peak RSS of the process", "rss_mb", fixed(0, " MB")))),
    "soak": BenchView(
        corner="job",
        rows=(("one pretraining job on the local Slurm cluster", 0, ""),),
        columns=(("steps", "steps", str), ("interruptions", "interruptions", str),
                 ("of them during a checkpoint save", "kills_during_save", str), ("restarts", "restarts", str),
                 ("end", "state", str), ("encoder bit-identical", "identical", lambda x: "yes" if x else "NO"),
                 ("uninterrupted", "reference_s", fixed(1, " s")),
                 ("interrupted", "soak_s", fixed(1, " s")))),
    "generate-cpu-profile": BenchView(
        corner="",
        rows=tuple((label, 0, (f"results.profile.batch1.{key}", f"results.profile.batch16.{key}"))
                   for label, key in PROFILE_ROWS),
        columns=(("batch 1", "0", fixed(0)), ("batch 16", "1", fixed(0)),
                 ("shared", ("0", "1"), lambda v: f"{v[0] / v[1]:.1f}×")),
        script="benchmarks/bench_generate.py", command=GENERATE_ARGS),
    "generate-cuda-profile": BenchView(
        corner="",
        rows=tuple((f"{cross}, batch {batch}", i, f"results.cuda_profile.{cross.lower()}_batch{batch}")
                   for cross, batch, i in (("flat", 1, 0), ("flat", 64, 0), ("flat", 256, 1), ("PHT", 1, 0),
                                           ("PHT", 64, 0))),
        columns=(("wall ms", "wall_ms_per_step", fixed(1)), ("GPU busy ms", "gpu_busy_ms_per_step", fixed(1)),
                 ("kernels", "kernels_per_step", fixed(0)), ("host syncs", "host_syncs_per_step", fixed(1))),
        script="benchmarks/bench_generate.py", command=GENERATE_ARGS),
    "loader": BenchView(
        corner="stage",
        rows=(("`make_item` alone, one core (shard reads, masking, packing, FLOP accounting)", 0,
               "rows.stage=make_item"),
              ("the per-document reference, one core (the same batches, one sentence array at a time)", 0,
               "rows.stage=per-document ref"),
              ("DataLoader, 1 worker (make_item + hand-over)", 0, "rows.stage=loader w=1"),
              ("DataLoader, 2 workers (both cores, the consumer included)", 0, "rows.stage=loader w=2")),
        columns=(("ms per batch", "ms_per_batch", fixed(1)),
                 ("tokens/s (best of the repeats)", "tokens_per_s", lambda x: f"{x / 1e6:.1f}M"),
                 ("x H100 at 45% MFU", "x_gpu_target", fixed(1))),
        script="benchmarks/bench_loader.py", command=("dataset", "workers", "repeats", "pin")),
    "prep-projection": PrepProjection(corner="segmenter", rows=(), columns=()),
    "summarize": BenchView(
        corner="run",
        rows=tuple((f"{n} process{'es' if n > 1 else ''}, {x}×", 0, f"runs.{n} process{'es' if n > 1 else ''}, {x}x")
                   for x in (1, 10) for n in (1, 2)),
        columns=(("records", "records", count), ("seconds", "seconds", fixed(1)), ("docs/s", "docs_per_s", fixed(1)),
                 ("steady docs/s", "steady_docs_per_s", fixed(1)), ("peak RSS", "peak_rss_mb", fixed(0, " MB"))),
        script="benchmarks/bench_summarize.py"),
    "generate-ratios": GenerateRatios(corner="", rows=(), columns=(), script="benchmarks/bench_generate.py",
                                      command=(*GENERATE_ARGS, "no_repeat_ngram", "rounds")),
    "mds-growth": MdsGrowth(corner="encoder", rows=(), columns=(), script="benchmarks/bench_mds.py",
                            command=("hidden", "batch", "repeats", "threads", "device", "precision")),
    "prep": BenchView(
        corner="prep workers",
        rows=(("1", 0, "summary_median.1"), ("2", 0, "summary_median.2")),
        columns=(("wall", "wall_s", fixed(1, " s")),
                 ("words/s/core, start-up included", "words_per_s_per_core", grouped),
                 ("words/s/core, once running", "steady_words_per_s_per_core", grouped),
                 ("speed-up: wall", "speedup_vs_1", fixed(2, "×")),
                 ("speed-up: busy CPU time", "cpu_speedup_vs_1", fixed(2, "×")))),
    "oracle": BenchView(
        corner="corpus",
        rows=(("CNN/DM", 0, "results.corpus=cnndm"), ("BBC", 0, "results.corpus=bbc")),
        columns=(("documents", "docs", count), ("sentences/doc", "mean_sentences", fixed(1)),
                 ("ours, cold stem cache", "docs_per_s.ours_cold", grouped),
                 ("ours, warm", "docs_per_s.ours_warm", grouped),
                 ("ours, beam 5", "docs_per_s.ours_beam5", grouped),
                 ("PreSumm's set approximation", "docs_per_s.presumm_b", grouped),
                 ("naive rouge-score greedy", "docs_per_s.naive_rouge_score_a", fixed(1)),
                 ("labels identical to the naive greedy", ("identical_to_a", "reference_a_docs"),
                  lambda v: f"{v[0]:,} / {v[1]:,}"))),
    "segment": BenchView(
        corner="segmenter",
        rows=tuple((label, 0, f"rows.{key}") for label, key in (
            ("stanza's spaCy variant (the offline default)", "spacy variant (default)"),
            ("the same through stanza's Document objects (`fast: false`)", "spacy variant, fast: false"),
            ("stanza's neural tokenizer (CPU)", "neural (CPU)"))),
        columns=(("words/s/core", "words_per_s_per_core", grouped),
                 ("GIGA-CM, segmentation alone", "words_per_s_per_core",
                  lambda rate: f"{GIGA_CM_WORDS / rate / 3600:.1f} core-hours"))),
    "segment-startup": BenchView(
        corner="a fresh process segments one paragraph",
        rows=(("direct path: stanza's variant built without stanza or torch", 0,
               "startup.direct path (no stanza, no torch)"),
              ("through `stanza.Pipeline`", 0, "startup.through stanza Pipeline"),
              ("the interpreter alone", 0, "startup.python alone")),
        columns=(("seconds, interpreter start included", "seconds", fixed(2, " s")),)),
    "stemmer": BenchView(
        corner="corpus",
        rows=(("CNN/DM articles + highlights", 0, "stemmer"),),
        columns=(("distinct words stemmed", "distinct_words", grouped),
                 ("data_prep/porter.py, words/s", "words_per_s.ours", grouped),
                 ("nltk's PorterStemmer (rouge-score's), words/s", "words_per_s.nltk", grouped),
                 ("speed-up", "speedup", fixed(2, "×")),
                 ("identical stems", ("identical", "distinct_words"), lambda v: f"{v[0]:,} / {v[1]:,}"))),
    "bare-bundle": BenchView(
        corner="offline_bundle.sh --suite, a node with nothing but Python and torch",
        rows=(("for the device's Python", 0, "bundle.device"), ("for the dry run's Python", 0, "bundle.local")),
        columns=(("Python", "python", str), ("wheels", "wheels", str), ("MiB", "wheels_mib", fixed(1)),
                 ("with the working tree", "carried_mib", fixed(1, " MiB")),
                 ("a device tool copies", "limit_mib", lambda v: f"{v} MiB"))),
    # docs/results/cnndm40k-pretrain-open-in-p<P>.json (pretrain/encoder_record.py): one pretraining unit's stages
    "pretraining-unit": BenchView(
        corner="stage",
        rows=(("open-domain (Reuters + Brown + Multi-News train)", 0, "stages.pretrain-open"),
              ("in-domain (CNN/DM 40k train), from it", 0, "stages.pretrain-in")),
        columns=(("steps", "steps", str), ("ppl (valid, last step)", "final_metrics.valid_ppl", fixed(1)),
                 ("tokens/s (median of the log windows)", "tokens_per_s_median", lambda v: f"{v:,.0f}"),
                 ("minutes", "minutes", fixed(1)),
                 ("val/test articles in its data", "overlap_shared", str))),
    "bare-steps": BenchView(
        corner="dry run: a torch-only virtualenv, --wheels",
        rows=tuple((step, 0, f"steps.step={step}") for step in
                   ("environment", "cuda_tests", "pretrain", "loss_curve", "profile", "resume", "mds")),
        columns=(("status", "status", str), ("seconds", "seconds", fixed(1)),
                 ("headline", "headline", lambda v: str(v).replace("|", "/")))),
    "scale-nodes": BenchView(
        corner="corpus",
        rows=(("100 MB", 0, "nodes"),),
        columns=(("Slurm array tasks", "shards", str), ("nodes", "nodes", ", ".join),
                 ("submission to merged manifest", "wall_s", fixed(0, " s")),
                 ("one local process, same plan", "local_one_process_s", fixed(0, " s")),
                 ("speed-up", "speedup_over_one_process", fixed(2, "×")),
                 ("byte-identical", ("byte_identical", "files_compared"),
                  lambda v: f"{'yes' if v[0] else 'NO'} ({v[1]} files)"))),
    "scaling": BenchView(
        corner="GPUs",
        rows=tuple((label, 0, (f"rows.compute=measured&gpus={gpus}&zero={zero}",
                               f"rows.compute=at 45% MFU&gpus={gpus}&zero={zero}"))
                   for label, gpus, zeros in (("1", 1, "-"), ("8 (1 node)", 8, "123"), ("32 (4×8)", 32, "123"))
                   for zero in zeros),
        columns=(("ZeRO", "0.zero", lambda z: "–" if z == "-" else str(z)),
                 ("comm / step", "0.comm_s", lambda x: f"{x * 1e3:.1f} ms" if x else "–"),
                 ("tokens/s, measured step: no overlap / overlap",
                  tuple(f"0.{k}" for k in OVERLAP_KEYS), overlap_rates),
                 ("at 45% MFU: no overlap / overlap", tuple(f"1.{k}" for k in OVERLAP_KEYS), overlap_rates),
                 ("GIGA-CM epoch (overlap): measured / 45%",
                  ("0.giga_cm_epoch_h_overlap", "1.giga_cm_epoch_h_overlap"),
                  lambda h: f"{h[0] * 60:.2g} / {h[1] * 60:.2g} min")),
        script="benchmarks/project_scaling.py", command=("measured", "nvlink_gbs", "ib_gbs", "accum", "target_mfu")),
}


RERUN = "`bash benchmarks/rerun_cpu.sh`"


def bench_made_line(view: BenchView, files: list[dict[str, Any]], source: str) -> str:
    """The commit and command each file records (`machine.commit`, `args` or `command`), or that it records none."""
    parts = []
    for name, data in zip(source.split("+"), files):
        machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
        command = view.command_line(data)
        if machine.get("commit") and command:
            dirty = " (with uncommitted changes)" if machine.get("tracked_changes") else ""
            parts.append(f"Made at commit {short(machine['commit'])}{dirty} by `{command}` ({name}).")
        elif command:
            parts.append(f"Made by `{command}` ({name}, which does not record the commit it ran at: "
                         f"{RERUN} remakes it at one).")
        else:
            missing = " and ".join(w for w, v in (("the commit", machine.get("commit")), ("the command", command))
                                   if not v)
            parts.append(f"Generated from {name}, which does not record {missing} that made it ({RERUN} remakes "
                         "it at one commit).")
    return " ".join(parts)


# ------------------------------------------------------------------ pages

def load(root: Path, name: str) -> dict[str, Any]:
    path = root / name
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise TableError(f"{name}: cannot read it ({e.strerror})") from None
    except ValueError as e:
        raise TableError(f"{name}: not JSON ({e})") from None


def provenance(root: Path, source: str) -> str:
    """The `provenance` view: for each results file `source` names (a glob reads every hibert-results/1 file it
    matches, in name order), its provenance line and, in a code block, the full command its `made` records."""
    names = ([str(p.relative_to(root)) for p in sorted(root.glob(source))] if any(c in source for c in "*?[")
             else source.split("+"))
    out: list[str] = []
    for name in names:
        results = load(root, name)
        if results.get("schema") != SCHEMA:
            if "+" in source or not any(c in source for c in "*?["):
                raise TableError(f"{name}: view 'provenance' reads {SCHEMA} files (`hibert compare --results`)")
            continue   # a glob passes over the directory's other files (a pretraining record)
        try:
            line = made_line(results, name, make_script(root, name), listed=False)
            command = results["made"]["command"]
        except (KeyError, IndexError, TypeError) as e:
            raise TableError(f"{name}: view 'provenance' finds no {e} in it") from None
        out += [*wrap(line), "", "```", *shell_lines(command), "```", ""]
    if not out:
        raise TableError(f"{source}: no {SCHEMA} file there")
    return "\n".join(out)


def render_block(root: Path, source: str, view: str, seen: set[str] | None = None) -> str:
    """What goes between the markers: the table, a blank line, the line saying what made it (then any notes).
    `seen`: the results files whose provenance line a block above on the same page carries (updated here)."""
    if view == "provenance":
        return provenance(root, source)
    files = [load(root, name) for name in source.split("+")]
    if view in RESULT_VIEWS:
        if len(files) != 1 or files[0].get("schema") != SCHEMA:
            raise TableError(f"{source}: view {view!r} reads one {SCHEMA} file (`hibert compare --results`)")
        try:
            body, notes = RESULT_VIEWS[view](files[0])
            made = (same_file_line(source) if seen is not None and source in seen
                    else made_line(files[0], source, make_script(root, source)))
        except (KeyError, IndexError, TypeError) as e:   # a file missing what the view reads: one line, as below
            raise TableError(f"{source}: view {view!r} finds no {e} in it") from None
        if seen is not None:
            seen.add(source)
        return "\n".join([*body, "", *wrap(made), *(line for note in notes for line in wrap(note))]) + "\n"
    if view in BENCH_VIEWS:
        try:
            body = BENCH_VIEWS[view].render(files)
        except (KeyError, IndexError, TypeError) as e:
            raise TableError(f"{source}: view {view!r} finds no {e} there") from None
        return "\n".join([*body, "", bench_made_line(BENCH_VIEWS[view], files, source)]) + "\n"
    views = ", ".join([*RESULT_VIEWS, "provenance", *BENCH_VIEWS])
    raise TableError(f"{source}: no view {view!r} (views: {views})")


def render_page(text: str, root: Path) -> str:
    """Every block of the page, in order: a results file's provenance line under its first table only."""
    seen: set[str] = set()
    return BLOCK.sub(lambda m: m["open"] + render_block(root, m["source"], m["view"], seen) + m["close"], text)


def pages(root: Path) -> list[Path]:
    """The pages, not a tool's hidden folder (.pytest_cache/README.md)."""
    return [p for pattern in PAGES for p in sorted(root.glob(pattern))
            if not any(part.startswith(".") for part in p.relative_to(root).parts)]


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 with a diff where a table differs")
    args = parser.parse_args(argv)
    differ = False
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        try:
            new = render_page(text, root)
        except TableError as e:
            print(f"{page.relative_to(root)}: {e}", file=sys.stderr)
            return 2
        if new == text:
            continue
        name = str(page.relative_to(root))
        if args.check:
            differ = True
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), name,
                                                       f"{name} (rendered)"))
        else:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {name}")
    if differ:
        print("\ntables differ from their results files: run `python docs/tables.py`", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
