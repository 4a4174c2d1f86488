"""`hibert demo` (`make demo`, `python -m hibert.demo`): run a recipe's staged pipeline locally on the shipped
sample and show the results. It lives with the chain it runs (slurm/stages.py, slurm/chain.py) and reads the
head registry (hibert/heads.py) and the reports (finetune/base/): every import points down.

The stages are the recipe's `slurm.pipeline` — the same chain `hibert submit` sends to Slurm — run here
as local subprocesses (training with 2 CPU ranks). A finished stage leaves a marker and is reused on the
next run unless --fresh; a failure names the stage and its log file.

Encoders pass between stages through registry aliases. In the demo's own store (`<output_dir>/mlflow.db`)
nothing else registers, so the stages keep the plain aliases (open-domain, in-domain, finetuned). When the
stages log to a shared store (`tracking.uri`, `$MLFLOW_TRACKING_URI`), the demo is a chain like
`hibert submit`'s (slurm/chain.py): its stages register and read `<alias>-<chain id>`, and the id is kept
in `<output_dir>/.stages/chain.json` so that a rerun still reuses finished stages. An init from outside the
chain is not pinned here: the stages start right away.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from hibert.config import Config, load_config
from hibert.errors import UserError
from hibert.finetune.inference.fluency import fluency_note
from hibert.finetune.evaluation.rouge import bootstrap_ci, format_p, seeded_paired_bootstrap, verdict
from hibert.finetune.compare import common_scores, shared_ids
from hibert.heads import head_of_export, registered_heads
from hibert.redact import redact_uri
from hibert.registry import DEFAULT_DB, client, tracking_uri
from hibert.slurm.chain import TRAINING, ChainError, StageInput, dependency_closure, link, new_chain_id, store_uri
from hibert.slurm.stages import default_pipeline, expand_seeds, find_recipe

LOCAL_SKIP = {"prep-merge", "summarize-merge"}    # a local prep / summarize (no shards) already merges


def stage_key(argv: list[str]) -> str:
    return hashlib.sha256(json.dumps(argv).encode()).hexdigest()[:16]


def chain_overrides(root: Path, recipe: Path, pipeline: list, extra: list[str],
                    run_name: str) -> dict[str, tuple[list[str], list[str]]]:
    """Per stage, the overrides that make the hand-offs per-chain; none while every training stage logs to
    the demo's own store."""
    inputs = [StageInput(st, load_config(recipe if st.recipe is None else st.recipe, [*extra, *st.overrides]))
              for st in pipeline]
    own = f"sqlite:///{root.resolve() / DEFAULT_DB}"
    shared = sorted({store_uri(i.cfg) for i in inputs if i.stage.command in TRAINING} - {own})
    if not shared:
        return {}
    marker = root / ".stages" / "chain.json"
    chain_id = json.loads(marker.read_text())["chain_id"] if marker.is_file() else None
    if chain_id is None:
        chain_id = new_chain_id(run_name)
        marker.write_text(json.dumps({"chain_id": chain_id}))
    print(f"[demo] shared tracking store {', '.join(redact_uri(u) for u in shared)}: chain {chain_id} "
          f"(aliases <alias>-{chain_id})", flush=True)
    try:
        links = link(inputs, chain_id, {st.name for st in pipeline}, continuing=False)
    except ChainError as e:
        raise UserError(f"[demo] {e}") from None
    return {name: (ln.overrides, ln.args) for name, ln in links.items()}


def run_stages(cfg: Config, recipe: Path, nproc: int, fresh: bool, extra: list[str],
               only: list[str] | None = None) -> list[dict]:
    """Run the pipeline's stages in order; `only`: just these and the stages they need (transitively)."""

    root = Path(cfg.run.output_dir)
    if fresh and root.exists():
        shutil.rmtree(root)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    (root / ".stages").mkdir(parents=True, exist_ok=True)
    pipeline = expand_seeds(cfg.slurm.pipeline or default_pipeline(cfg), cfg.slurm.seeds, cfg.run.name)
    chain = chain_overrides(root, recipe, pipeline, extra, cfg.run.name)
    wanted = None
    if only:
        closure = dependency_closure(pipeline)  # a seeded stage's name picks all its seeds
        only = [c for n in only for c in ([x for x in closure if x.startswith(f"{n}-seed")] if n not in closure else [n])
                or [n]]
        unknown = sorted(set(only) - set(closure))
        if unknown:
            raise UserError(f"[demo] no stage {', '.join(unknown)} in {recipe}; stages: {', '.join(closure)}")
        wanted = set(only).union(*(closure[name] for name in only))
    rows = []
    for st in pipeline:
        if st.command in LOCAL_SKIP or (wanted is not None and st.name not in wanted):
            continue
        stage_recipe = recipe if st.recipe is None else st.recipe
        chain_over, chain_args = chain.get(st.name, ([], []))
        argv = [sys.executable, "-m", "hibert.cli", st.command, str(stage_recipe), *extra, *st.overrides,
                *chain_over, *st.args, *chain_args]
        if st.command in ("pretrain", "finetune", "summarize") and nproc > 1:
            argv += ["--nproc", str(nproc)]
        marker = root / ".stages" / f"{st.name}.json"
        log = root / "logs" / f"{st.name}.log"
        if marker.is_file() and json.loads(marker.read_text()).get("key") == stage_key(argv):
            rows.append({"stage": st.name, "seconds": json.loads(marker.read_text())["seconds"], "reused": True})
            print(f"[demo] {st.name:<14} reused (finished earlier; --fresh to redo)", flush=True)
            continue
        print(f"[demo] {st.name:<14} running: hibert {st.command} ... (log: {log})", flush=True)
        t0 = time.time()
        with open(log, "a") as f:
            f.write(f"\n$ {' '.join(argv)}\n")
            f.flush()
            code = subprocess.call(argv, stdout=f, stderr=subprocess.STDOUT)
        dt = time.time() - t0
        if code != 0:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print("\n".join("    " + line for line in tail))
            raise UserError(f"[demo] stage {st.name!r} failed (exit {code}) after {dt:.0f}s; full log: {log}")
        marker.write_text(json.dumps({"key": stage_key(argv), "seconds": dt}))
        rows.append({"stage": st.name, "seconds": dt, "reused": False})
        print(f"[demo] {st.name:<14} done in {dt:.0f}s", flush=True)
    return rows


def plot_losses(cfg: Config, out: Path) -> Path | None:
    """Training/validation loss curves of every training run in the demo's MLflow store, each run's kept
    checkpoint marked (the step its export holds: `selected_steps` of its export.json, else `step`)."""
    import matplotlib  # here, not at the top: the backend must be chosen before pyplot is imported

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: ~0.37 s with matplotlib, which only the demo's loss chart needs

    c = client(tracking_uri(cfg.tracking.uri, cfg.run.output_dir))
    exp = c.get_experiment_by_name(cfg.tracking.experiment)
    if exp is None:
        return None
    runs = c.search_runs([exp.experiment_id], filter_string="tags.task != ''")
    # one row of plots per task: their losses (masked-sentence NLL, sentence labels, summary NLL, ranking) live
    # on different scales
    titles = {"masked_sentence": "pretraining", **{name: h.title for name, h in registered_heads().items()}}
    present = {r.data.tags.get("task") for r in runs}
    tasks = [t for t in titles if t in present] or ["masked_sentence"]
    kept: dict[str, tuple[list[int], str]] = {}   # MLflow run id -> (the steps its export holds, chosen by)
    for path in Path(cfg.run.output_dir).glob("*/export/export.json"):
        try:
            meta = json.loads(path.read_text())
            steps = meta.get("selected_steps") or ([meta["step"]] if meta.get("step") is not None else [])
            kept[str(meta["mlflow_run_id"])] = ([int(x) for x in steps], str(meta.get("selection_metric") or ""))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
    series = []
    for run in sorted(runs, key=lambda r: r.info.start_time):
        task = run.data.tags.get("task", "")
        if task not in tasks:
            continue
        curves = {}
        for key in ("train_loss", "valid_loss"):
            hist = sorted(c.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
            curves[key] = ([m.step for m in hist], [m.value for m in hist])
        steps, metric = kept.get(run.info.run_id, ([], ""))
        series.append({"task": task, "name": run.info.run_name, **curves, "kept": steps, "kept_by": metric})
    fig = loss_figure([(t, titles[t]) for t in tasks], series)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def loss_figure(rows: list[tuple[str, str]], series: list[dict]):
    """The loss chart: a row per (task, title) of `rows`, training loss left and validation loss right; each of
    `series` ({"task", "name", "train_loss": (steps, values), "valid_loss": (steps, values), "kept": [steps],
    "kept_by": the validation metric that chose them})
    one line, its kept checkpoint a dotted vertical line in its colour and, on the validation curve, a star
    (the legend says the step)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 2, figsize=(10, 3.4 * len(rows)), squeeze=False)
    index = {task: i for i, (task, _) in enumerate(rows)}
    for s in series:
        row = index.get(s["task"])
        if row is None:
            continue
        kept = sorted(s.get("kept") or [])
        by = f", best {s['kept_by']}" if s.get("kept_by") else ""
        label = s["name"] + (f" (kept: step {', '.join(map(str, kept))}{by})" if kept else "")
        for ax, key in zip(axes[row], ("train_loss", "valid_loss")):
            steps, values = s.get(key) or ([], [])
            if not steps:
                continue
            line, = ax.plot(steps, values, marker="." if key == "valid_loss" else None, label=label)
            for step in kept:
                ax.axvline(step, color=line.get_color(), linestyle=":", linewidth=1.2)
                if key == "valid_loss" and step in steps:
                    ax.plot([step], [values[steps.index(step)]], marker="*", markersize=12, linestyle="none",
                            color=line.get_color(), markeredgecolor="black", markeredgewidth=0.5)
    for row, (_, title) in enumerate(rows):
        for ax, kind in zip(axes[row], ("training loss", "validation loss")):
            ax.set_title(f"{title}: {kind}")
            ax.set_xlabel("step")
            ax.set_ylabel(kind)
            if ax.lines:
                ax.legend(fontsize=7, title="dotted line, star: the checkpoint kept (exported)"
                          if any(s.get("kept") for s in series if index.get(s["task"]) == row) else None,
                          title_fontsize=7)
    return fig


def print_results(reports: list[dict], names: list[str]) -> list[tuple[str, list[tuple[str, dict]]]]:
    """One table per dataset: every finetuned model on it, then Lead-3 and the oracle (the same documents
    in every report of a dataset). Returns each table's (title, rows) for `write_comparison`."""
    tables: list[tuple[str, list[tuple[str, dict]]]] = []
    groups: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    heads = registered_heads()
    for name, rep in zip(names, reports):  # a head's own report kind (a ranker's recall at L') prints itself
        head = heads.get(rep.get("meta", {}).get("task"))
        if head is not None and head.report_lines is not None:
            print("\n" + "\n".join(head.report_lines(name, rep)))
    reports, names = [r for r in reports if "scores" in r], [n for n, r in zip(names, reports) if "scores" in r]
    for name, rep in zip(names, reports):  # one table per dataset and head
        key = (rep["meta"].get("dataset_manifest", "?"), rep["meta"].get("task", "summarization"))
        groups.setdefault(key, []).append((name, rep))
    for members in groups.values():
        first = members[0][1]
        rows: list[tuple[str, dict]] = []
        for name, seeds in by_system(members).items():
            init = seeds[0]["meta"].get("encoder_init") or "random init"
            label = f"{name} ({init.replace('models:/', '')})" + (f", {len(seeds)} seeds" if len(seeds) > 1 else "")
            rows.append((label, seed_summary(seeds)))
        for system in ("lead3", "oracle"):
            if system in first["scores"]:
                rows.append((system, first["scores"][system]))
        where = first["meta"].get("dataset") or f"dataset {first['meta'].get('dataset_manifest', '?')}"
        title = (f"{first['meta'].get('task', 'summarization')}: ROUGE F1 on {first['num_documents']} held-out "
                 f"{first['meta'].get('split', 'test')} documents of {where} (rouge-score, 95% CI)")
        tables.append((title, rows))
        print(f"\n== {title} ==")
        width = max(len(r[0]) for r in rows)
        for label, sc in rows:
            cells = "  ".join(f"{m.replace('_f', '')} {sc[m]['mean']:5.2f} [{sc[m]['low']:5.2f},{sc[m]['high']:5.2f}]"
                              + (f" ±{sc[m]['seed_sd']:.2f}" if sc[m].get("seed_sd") is not None else "")
                              for m in ("rouge1_f", "rouge2_f", "rougeL_f"))
            print(f"  {label:<{width}}  {cells}")
        print_paired(members)
        for name, rep in members:  # reports of summaries that are not extracts
            st = rep.get("abstractiveness", {}).get("model")
            if st:
                print(f"  {name}: novel 1/2/3-grams {st['novel_1gram']:.1f}/{st['novel_2gram']:.1f}/"
                      f"{st['novel_3gram']:.1f}%, repeated 3-grams {st['repeated_3gram']:.1f}%, "
                      f"{st['mean_words']:.1f} words")
    return tables


def write_comparison(out_dir: Path, printed: str, tables: list[tuple[str, list[tuple[str, dict]]]]) -> Path | None:
    """The demo's comparison of its runs — the pretrained and random-init models of each head next to Lead-3 and
    the oracle, with the paired differences — as `comparison.md` (what the demo printed) and `comparison.png`
    (a panel per table: R1/R2/RL bars with their 95% CIs). Each run's own report has its own model only."""
    if not tables:
        return None
    import matplotlib  # lazy: ~0.4 s

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = ("rouge1_f", "rouge2_f", "rougeL_f")
    fig, axes = plt.subplots(len(tables), 1, figsize=(10, 3.4 * len(tables)), squeeze=False)
    for ax, (title, rows) in zip(axes[:, 0], tables):
        width = 0.8 / len(rows)
        for i, (label, sc) in enumerate(rows):
            xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(metrics))]
            means = [sc[m]["mean"] for m in metrics]
            errs = [[sc[m]["mean"] - sc[m]["low"] for m in metrics], [sc[m]["high"] - sc[m]["mean"] for m in metrics]]
            ax.bar(xs, means, width, yerr=errs, capsize=3, label=label)
        ax.set_xticks(range(len(metrics)), ["ROUGE-1", "ROUGE-2", "ROUGE-L"])
        ax.set_ylabel("F1 (%)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out_dir / "comparison.png", dpi=110)
    plt.close(fig)
    (out_dir / "comparison.md").write_text(
        "# The demo's runs compared\n\nWhat `hibert demo` printed: each head's pretrained and random-init models on "
        "the same test documents, next to Lead-3 and the oracle; the paired differences say what their intervals "
        "allow. Chart: comparison.png.\n\n```text\n" + printed.strip() + "\n```\n", encoding="utf-8")
    return out_dir / "comparison.md"


SEED_SUFFIX = re.compile(r"-seed\d+$")


def by_system(members: list[tuple[str, dict]]) -> dict[str, list[dict]]:
    """Reports grouped by system: runs named <name>-seed<S> are seeds of <name> (slurm.seeds)."""
    out: dict[str, list[dict]] = {}
    for name, rep in members:
        out.setdefault(SEED_SUFFIX.sub("", name), []).append(rep)
    return out


def _runs(reports: list[dict]) -> list[tuple[dict, list[str]]]:
    """(per-document model scores, document ids) of each seed's report, as `hibert compare` reads them."""
    return [(r["per_document"]["model"], r["per_document"]["doc_ids"]) for r in reports]


def seed_summary(seeds: list[dict]) -> dict[str, dict]:
    """{metric: mean over seeds of the model's mean, 95% bootstrap CI over the documents all seeds hold of the
    per-document mean over seeds (as `hibert compare`), sd of the per-seed means}."""
    if len(seeds) == 1:
        return seeds[0]["scores"]["model"]
    ids = shared_ids(_runs(seeds)) if all("per_document" in r for r in seeds) else []
    out = {}
    for m in ("rouge1_f", "rouge2_f", "rougeL_f"):
        means = np.array([r["scores"]["model"][m]["mean"] for r in seeds])
        # no documents in common: no interval over them (nan prints as such rather than a made-up one)
        low, high = bootstrap_ci(common_scores(_runs(seeds), m, ids).mean(0)) if ids else (float("nan"),) * 2
        out[m] = {"mean": float(means.mean()), "low": low, "high": high, "seed_sd": float(means.std(ddof=1))}
    return out


def print_paired(members: list[tuple[str, dict]]) -> None:
    """Each encoder-initialized system against the random-init one, paired over the documents all their reports
    hold (by id) and, when they ran with several seeds, over seeds too; each difference says what its interval
    allows. A system sharing no documents with the random-init one is named, not left out."""
    systems = by_system(members)
    base = next(((n, r) for n, r in systems.items() if not r[0]["meta"].get("encoder_init")), None)
    if base is None or any("per_document" not in r for r in base[1]):
        return
    for name, reps in systems.items():
        if name == base[0]:
            continue
        if any("per_document" not in r for r in reps):
            print(f"  {name} - {base[0]}: not paired (a report without per-document scores)")
            continue
        ids = shared_ids(_runs(base[1]), _runs(reps))
        if not ids:
            print(f"  {name} - {base[0]}: not paired (no documents in common)")
            continue
        cells, reads = [], ""
        for m in ("rouge1_f", "rouge2_f", "rougeL_f"):
            d = seeded_paired_bootstrap(common_scores(_runs(reps), m, ids), common_scores(_runs(base[1]), m, ids))
            cells.append(f"{m.replace('_f', '')} {d['diff']:+5.2f} [{d['low']:+5.2f},{d['high']:+5.2f}] "
                         + format_p(d["p_value"], d["resamples"]))
            reads = reads or verdict(d["low"], d["high"])
        held = max(len(r["per_document"]["doc_ids"]) for r in reps + base[1])
        docs = f"{len(ids)} documents" + (f" of {held}" if len(ids) < held else "")
        print(f"  {name} - {base[0]} (paired bootstrap, {docs}, {len(reps)}/{len(base[1])} seeds):  "
              + "  ".join(cells) + f"  -> ROUGE-1: {reads}"
              + ("" if len(reps) > 1 and len(base[1]) > 1 else " (one seed: an ordering cannot be read from it)"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", nargs="?", default="demo", help="recipe with a slurm.pipeline (default: demo)")
    p.add_argument("overrides", nargs="*", help="dotted overrides applied to every stage")
    p.add_argument("--fresh", action="store_true", help="start from nothing instead of reusing finished stages")
    p.add_argument("--nproc", type=int, default=2, help="local ranks for training stages")
    p.add_argument("--stages", default=None, metavar="A,B",
                   help="comma-separated stage names: run only these and the stages they wait for "
                        "(finished ones are reused); default: the whole pipeline")
    p.add_argument("--seeds", default=None, metavar="S1,S2,..",
                   help="run every finetune/evaluate stage once per seed (slurm.seeds); the tables then give "
                        "mean ± sd over seeds and pair systems over documents and seeds")
    p.add_argument("--article", default="samples/cnndm_test_sample.jsonl",
                   help="held-back articles; the first one is summarized at the end")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hibert demo", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UserError as e:
        print(e, file=sys.stderr)
        return 1


def ui_url(base: str, uri: str, experiment: str) -> str:
    """The MLflow UI page of the experiment's runs. MLflow 3.x's UI opens an experiment in its GenAI view (traces)
    unless told the workflow is model training: the `workflowType` query parameter does (and the UI remembers
    it); the experiment's `mlflow.experimentKind` tag, which some 3.x versions read instead, is set as well
    (hibert/registry.py)."""
    try:
        exp = client(uri).get_experiment_by_name(experiment)
    except Exception:  # noqa: BLE001 - a store MLflow cannot open: the UI's front page then
        exp = None
    page = f"#/experiments/{exp.experiment_id}/runs" if exp is not None else "#/experiments"
    return f"{base}/{page}?workflowType=machine_learning"


def serve_lines(exports: list[Path], uri: str) -> list[str]:
    """How to serve the newest registered export of each head that summarizes (its pyfunc flavor) — only a model
    whose decoder can write: one that cannot yet is named with the reason, not offered as a first served model."""
    lines = []
    port = 5001
    for kind, head in registered_heads().items():
        mine = [e for e in exports if head_of_export(e).name == kind and (e / "MLmodel").is_file()]
        if head.summarizer is None or not mine:
            continue
        try:
            version = json.loads((mine[-1] / "registry.json").read_text()).get("version")
        except (OSError, ValueError):
            version = None
        ref = f"models:/{head.registered_model}/{version}" if version else str(mine[-1].resolve())
        note = fluency_note(mine[-1]) if head.decodes else None
        if note:
            lines.append(f"  not served:   {ref}: {note.split(':')[0]} (its registered version says so)")
            continue
        lines.append(f"  serve:        MLFLOW_TRACKING_URI={redact_uri(uri)} .venv/bin/hibert serve {ref} --port {port}"
                     "   (then POST /invocations: docs/serving.md)")
        port += 1
    return lines


def _run(args: argparse.Namespace) -> int:
    if "=" in args.recipe:  # `hibert demo key=value`: an override, not a recipe
        args.overrides, args.recipe = [args.recipe, *args.overrides], "demo"
    recipe = find_recipe(args.recipe)
    cfg = load_config(recipe, args.overrides)
    if args.seeds:  # the chain's shape only: the stages' own command lines (and so their reuse) do not change
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            raise UserError(f"[demo] --seeds {args.seeds!r}: comma-separated integers, e.g. 1,2,3") from None
        cfg = load_config(recipe, [*args.overrides, f"slurm.seeds=[{','.join(map(str, seeds))}]"])
    t0 = time.time()
    only = [name.strip() for name in args.stages.split(",") if name.strip()] if args.stages else None
    rows = run_stages(cfg, recipe, args.nproc, args.fresh, args.overrides, only)
    root = Path(cfg.run.output_dir)

    print("\n== stages ==")
    for r in rows:
        print(f"  {r['stage']:<14} {r['seconds']:7.1f}s{'  (reused)' if r['reused'] else ''}")
    print(f"  {'total':<14} {time.time() - t0:7.1f}s (this invocation)")

    reports = sorted(root.glob("*/report-test/report.json"))
    comparison = None
    if reports:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            tables = print_results([json.loads(r.read_text()) for r in reports], [r.parent.parent.name for r in reports])
        print(buffer.getvalue(), end="")
        comparison = write_comparison(root / "report", buffer.getvalue(), tables)
    curves = plot_losses(cfg, root / "report" / "loss_curves.png")

    article = Path(args.article)

    finetuned = sorted(p.parent for p in root.glob("*finetune*/export/export.json") if "random" not in p.parts[-3])
    for kind, head in registered_heads().items():  # the last finetuned export of each head that summarizes text
        exports = [e for e in finetuned if head_of_export(e).name == kind]
        if exports and article.is_file() and head.summarizer is not None and head.reads == "documents":
            print(f"\n== {kind} summary of a held-back article ({article}, first record; {exports[-1]}) ==")
            note = fluency_note(exports[-1]) if head.decodes else None
            if note:  # its numbers are in the tables above; repeated pieces are not shown as a summary
                print(f"(not shown) {note}")
                continue
            out = subprocess.run([sys.executable, "-m", "hibert.cli", "summarize", str(recipe), *args.overrides,
                                  "--model", str(exports[-1]), "--input", str(article), "--field", "article",
                                  "--limit", "1"], capture_output=True, text=True)
            print(out.stdout.strip() or out.stderr.strip()[-2000:])

    print("\n== where to look ==")
    for r in reports:
        print(f"  report:       {r.with_suffix('.md')}  (chart: {r.parent / 'rouge.png'})")
        if (r.parent / "viewer.html").is_file():
            print(f"  viewer:       {r.parent / 'viewer.html'}  (open in a browser: sources, picks, copied spans; "
                  "#worst sorts worst first)")
    if comparison:
        print(f"  comparison:   {comparison}  (chart: {comparison.with_suffix('.png')}; pretrained vs random init)")
    if curves:
        print(f"  loss curves:  {curves}")

    uri = tracking_uri(cfg.tracking.uri, root, create=False)
    for line in serve_lines(finetuned, uri):
        print(line)
    if uri != f"sqlite:///{(root / 'mlflow.db').resolve()}":  # a shared store: the chain's aliases are there
        print(f"  registry:     {redact_uri(uri)}  (hibert registry list)")
        return 0
    print(f"  registry:     hibert registry list --output-dir {root}")
    # MLflow's server imports a Starlette module Starlette deprecates: 4 warnings (one per worker) a user can do
    # nothing about, silenced by message for this command only
    print(f"  MLflow UI:    PYTHONWARNINGS='ignore:starlette.middleware.wsgi is deprecated' .venv/bin/mlflow ui "
          f"--backend-store-uri sqlite:///{(root / 'mlflow.db').resolve()} --port 5000 --workers 1   (then open {ui_url('http://localhost:5000', uri, cfg.tracking.experiment)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
