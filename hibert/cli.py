"""`hibert` — the one command. Subcommands load the typed config and hand it to their package.

Heavy imports (torch, deepspeed, mlflow) happen inside the handlers so `hibert --help` stays fast.
"""
from __future__ import annotations

import argparse
import atexit
import ctypes
import importlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import NoReturn

import yaml

from hibert.config import ConfigError, dump_yaml, load_config
from hibert.errors import UserError, disk_full, free_mb, not_writable
from hibert.logs import set_level, setup_logging
from hibert.redact import redact_config_dict
from hibert.registry import bound_http_retries

# name -> (module:function, one-line help, takes a config)
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "prep": ("hibert.data_prep.cli:run", "Turn raw corpora into segmented, SentencePiece-encoded, memory-mapped shards "
             "with a manifest (stanza segmentation, oracle labels, sharded/resumable).", True),
    "synth-clusters": ("hibert.data_prep.synthetic_clusters:run", "Build SYNTHETIC multi-document clusters (an article + "
                       "its tf-idf nearest neighbours of the same split) from a single-document JSONL corpus.", False),
    "pretrain": ("hibert.pretrain.cli:run", "Masked-sentence pretraining of a HIBERT encoder with DeepSpeed ZeRO "
                 "(open-domain or in-domain stage), checkpointed, resumable, tracked in MLflow.", True),
    "finetune": ("hibert.finetune.cli:run_finetune", "Finetune an encoder from the registry (or a path): extractive, "
                 "abstractive, multi-document ranker or summarizer (finetune.task); keeps the best checkpoint.", True),
    "evaluate": ("hibert.finetune.cli:run_evaluate", "ROUGE evaluation with bootstrap confidence intervals next to "
                 "Lead-3 and the oracle; writes a Markdown/JSON report and a chart.", True),
    "compare": ("hibert.finetune.compare:run", "Paired bootstrap between evaluation reports already written (each "
                "against the first, over the documents both hold): ROUGE differences with 95-percent CIs and p-values.", False),
    "summarize": ("hibert.finetune.cli:run_summarize", "Summarize raw text (a file, JSONL of documents, or - for stdin) "
                  "with a finetuned model.", True),
    "submit": ("hibert.slurm.submit:run", "Render sbatch scripts for a recipe and submit the staged chain "
               "(prep -> merge -> pretrain -> finetune -> evaluate) to Slurm.", True),
    "demo": ("hibert.slurm.local:run", "Run a recipe's staged pipeline locally (default: the demo on the shipped sample: "
             "prep -> pretraining -> finetuning -> evaluation -> summaries) and show the results.", False),
    "serve": ("hibert.finetune.serving.server:run", "Serve a finetuned model over HTTP: MLflow's scoring server "
              "(/invocations) behind a guard that bounds the body and answers malformed requests in one line.", False),
    "export-hf": ("hibert.hf_export.cli:run", "Write an encoder export (or a models:/ reference) as a Hugging Face "
                  "folder: config.json, model.safetensors, remote code, tokenizer and model card "
                  "(AutoModel.from_pretrained(..., trust_remote_code=True)).", False),
    "registry": ("hibert.registry_cli:run", "List or show the models registered in the MLflow model registry "
                 "(encoders and finetuned heads), or send what a tracking outage left in a run's outbox.", False),
}


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=None,
                   help="recipe YAML (a path, or the name of one in configs/recipes); defaults if omitted")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides, e.g. model.hidden=512 optimizer.lr=1e-4")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def version() -> str:
    try:
        return dist_version("hibert-platform")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hibert", description="Pretrain and finetune hierarchical document encoders (HIBERT).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper,
                        default=None, help="log level of this command and the ranks it starts (default INFO; "
                        "ranks other than 0 log warnings only)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (target, help_text, takes_config) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if takes_config:
            _add_config_args(p)
        func = target.partition(":")[2]
        hook = f"add_{func[4:]}_arguments" if func.startswith("run_") else "add_arguments"
        extra = _resolve(target, hook, optional=True)
        if extra is not None:
            extra(p)
    return parser


def _resolve(target: str, attr: str | None = None, optional: bool = False) -> Callable | None:
    """Import `module:function` (or a sibling attribute, e.g. the module's `add_arguments`)."""
    module_name, _, func = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if optional and e.name == module_name:
            return None
        raise
    fn = getattr(module, attr or func, None)
    if fn is None and not optional:
        raise SystemExit(f"hibert: {module_name}.{attr or func} is missing")
    return fn


def _split_config_and_overrides(args: argparse.Namespace) -> None:
    # argparse puts a first `key=value` into `config`; move it to the overrides.
    if getattr(args, "config", None) and "=" in args.config:
        args.overrides = [args.config, *args.overrides]
        args.config = None


def main(argv: Sequence[str] | None = None) -> int:
    try:  # the settings flags come from the head registry: a plugin module that fails to import is one line
        parser = build_parser()
    except UserError as e:
        print(e, file=sys.stderr)
        return 2
    args, extra = parser.parse_known_args(argv)
    # `key=value` overrides may come after options (`--nproc 2 model.hidden=64`); anything else is an error
    stray = [e for e in extra if "=" in e and not e.startswith("-")]
    unknown = [e for e in extra if e not in stray]
    if unknown or (stray and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or stray)}")
    if stray:
        args.overrides = [*args.overrides, *stray]
    if not args.command:
        parser.print_help()
        return 2
    set_level(args.log_level)
    setup_logging(0)
    bound_http_retries()
    target, _, takes_config = COMMANDS[args.command]
    cfg = None
    if takes_config:
        _split_config_and_overrides(args)
        try:
            cfg = load_config(args.config, args.overrides)
        except (ConfigError, UserError) as e:
            print(f"hibert {args.command}: {e}", file=sys.stderr)
            return 2
        if args.print_config:  # secrets masked: the printout ends up in logs; config.resolved.yaml keeps them
            print(yaml.safe_dump(redact_config_dict(cfg.model_dump(mode="json")), sort_keys=False), end="")
            return 0
    try:
        handler = _resolve(target)
    except ModuleNotFoundError as e:
        if e.name != target.partition(":")[0]:
            raise
        print(f"hibert {args.command}: not available in this installation ({e.name} is missing)", file=sys.stderr)
        return 2
    try:
        return int((handler(args) if not takes_config else handler(cfg, args)) or 0)
    except (OSError, RuntimeError) as e:
        if not_writable(e) and getattr(e, "filename", None):  # a read-only target the command's own checks missed
            print(f"hibert {args.command}: {e.filename} is not writable ({e.strerror})", file=sys.stderr)
            return 2
        if not disk_full(e):
            raise
        where = getattr(e, "filename", None) or (cfg.data.output if cfg is not None and args.command == "prep"
                                                 else cfg.run_dir if cfg is not None else ".")
        print(f"hibert {args.command}: no space left on device writing under {where} ({free_mb(where)}): free space "
              "and run the same command again (prep keeps its finished shards, training its complete checkpoints)",
              file=sys.stderr)
        return 1


def _instrumented() -> bool:
    """A profiler, debugger or coverage tool is attached: `sys.setprofile`/`settrace`, or from 3.12 on
    `sys.monitoring` (cProfile, debugpy, coverage's sysmon core)."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(i) is not None for i in range(6))


def run() -> NoReturn:
    """The `hibert` executable: `main()`, then the exit a normal one does — other threads joined, every atexit
    handler run (logging, MLflow, multiprocessing, ...), Python's and the C library's output buffers written —
    without the interpreter's teardown after it. With torch, DeepSpeed and MLflow loaded that teardown (freeing
    every module, C++ static destructors) took ~2 s per process on 2 cores, after the work was done and its
    files closed: every stage and every rank paid it. An exception still ends the process the usual way,
    traceback included, and so does a run under a profiler or debugger (they write their results after this)."""
    code = main()
    shutdown_threads = getattr(threading, "_shutdown", None)  # what Py_Finalize does first
    if shutdown_threads is None or _instrumented():
        sys.exit(code)
    shutdown_threads()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except OSError as e:  # as CPython's own exit: output lost at the end (a full disk, a closed pipe) is exit 120
        print(f"hibert: writing the output failed: {e}", file=sys.stderr)
        code = code or 120
    except ValueError:    # stdout closed by the command itself
        pass
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:  # what exit() does and os._exit skips: printf output of C/C++ libraries (DeepSpeed, NCCL) still buffered
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
    os._exit(code)


if __name__ == "__main__":
    run()
