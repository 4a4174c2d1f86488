"""The `hibert` command: help for every subcommand, config errors are clear and non-zero."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hibert.cli import COMMANDS, main


def test_top_level_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in sorted(COMMANDS):  # every description must survive argparse's %-formatting
        assert name in out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_subcommand_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert f"hibert {command}" in out
    assert COMMANDS[command][1].split()[0] in out  # the description is shown


def test_unknown_option_fails(capsys):
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--no-such-option"])
    assert e.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_invalid_override_names_key(capsys):
    assert main(["pretrain", "model.hiden=512"]) == 2
    err = capsys.readouterr().err
    assert "model.hiden" in err and "model.hidden" in err


def test_print_config(capsys):
    assert main(["pretrain", "model=hibert_m", "--print-config"]) == 0
    assert "hidden: 768" in capsys.readouterr().out


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "hibert.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "registry" in out.stdout


def test_registry_list_on_empty_store(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["registry", "list", "--uri", uri]) == 0
    assert "no registered models" in capsys.readouterr().out


def test_overrides_may_follow_options(capsys):
    assert main(["pretrain", "--stage", "open-domain", "model.hidden=256", "--print-config"]) == 0
    assert "hidden: 256" in capsys.readouterr().out


def test_local_store_keeps_artifacts_next_to_the_database(tmp_path, monkeypatch):
    import mlflow

    from hibert.registry import ensure_experiment

    monkeypatch.chdir(tmp_path)
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # MLflow exports these: undo at teardown
        monkeypatch.setenv(var, "unset")
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    ensure_experiment(uri, "exp")
    with mlflow.start_run():
        mlflow.log_text("hi", "a.txt")
    assert list((tmp_path / "store" / "mlartifacts").rglob("a.txt"))
    assert not (tmp_path / "mlruns").exists()
    mlflow.set_tracking_uri(None)  # MLflow's in-process default ("" would mean a file store in the cwd)


def test_building_every_command_parser_imports_no_heavy_library():
    """`hibert --help` (and every command, which builds the whole parser first) stays fast: the heads, the
    runtime, torch, DeepSpeed, MLflow and rouge-score (nltk) load only when a command needs them."""
    import subprocess
    import sys

    code = ("import sys; from hibert.cli import build_parser; build_parser(); "
            "print(sorted({'torch', 'deepspeed', 'mlflow', 'nltk', 'rouge_score', 'stanza'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_relaunching_on_local_ranks_imports_no_heavy_library(tmp_path, command):
    """`--nproc N`: the launching process starts the ranks without importing torch, DeepSpeed, MLflow or the
    heads itself (each rank does; the launcher's own imports cost ~1.5 s before any rank started)."""
    code = ("import sys; import hibert.runtime.launch as launch; from hibert.cli import main\n"
            "launch.launch_local = lambda n, argv: print(n, argv[2], sorted({'torch', 'deepspeed', 'mlflow', 'nltk',"
            " 'rouge_score', 'hibert.finetune.extractive.head'} & set(sys.modules))) or 0\n"
            f"sys.exit(main([{command!r}, 'run.output_dir={tmp_path}', '--nproc', '2']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"2 {command} []", (out.stdout, out.stderr[-2000:])


def test_the_executable_exits_with_mains_code_after_every_exit_handler(tmp_path):
    """`hibert.cli.run` (the `hibert` executable, `python -m hibert.cli`) skips only the interpreter's teardown:
    main's exit code, atexit handlers, other threads finished, buffered output written."""
    marker = tmp_path / "atexit.txt"
    code = ("import atexit, sys, threading, time, hibert.cli as c\n"
            f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
            f"threading.Thread(target=lambda: (time.sleep(0.3), open({str(marker)!r} + '.thread', 'w').write('x'))).start()\n"
            "c.main = lambda: (sys.stdout.write('no newline, buffered'), 3)[1]\n"
            "c.run()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and out.stdout == "no newline, buffered", (out.returncode, out.stdout, out.stderr)
    assert marker.read_text() == "ran" and (tmp_path / "atexit.txt.thread").is_file()


@pytest.mark.parametrize("profiled", [False, True])
def test_the_executable_skips_the_interpreter_teardown_unless_profiled(tmp_path, profiled):
    """Teardown (a module-level object's __del__ runs there) is skipped, except under a profiler: `python -m
    cProfile ...` (sys.setprofile up to 3.11, sys.monitoring from 3.12) writes its results after run() returns."""
    marker, script, stats = tmp_path / "teardown.txt", tmp_path / "entry.py", tmp_path / "out.prof"
    script.write_text("import hibert.cli as c\n"
                      "class Witness:\n"
                      f"    def __del__(self, _open=open): _open({str(marker)!r}, 'w').write('torn down')\n"
                      "witness = Witness()\n"
                      "c.main = lambda: 0\nc.run()\n")
    cmd = [sys.executable, *(["-m", "cProfile", "-o", str(stats)] if profiled else []), str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert marker.is_file() == profiled and stats.is_file() == profiled


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_lost_at_exit_is_a_failure_not_success():
    """As CPython's own exit: stdout that cannot be written at the end (a full disk) is exit 120 and one line."""
    code = "import sys, hibert.cli as c; c.main = lambda: (sys.stdout.write('summary ' * 20), 0)[1]; c.run()"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}   # buffered: written at the exit
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "-c", code], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                             env=env)
    assert out.returncode == 120 and "hibert: writing the output failed" in out.stderr, (out.returncode, out.stderr)


def test_registry_list_survives_names_holding_quotes(tmp_path, capsys):
    """One registered model named o'brien on a shared store broke `hibert registry list` for everyone (a name
    pasted into MLflow's filter string); a name holding both quotes is filtered here instead."""
    from mlflow import MlflowClient

    from hibert.registry import register_artifact_dir, versions_where

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = MlflowClient(uri)
    run = c.create_run(c.create_experiment("x")).info.run_id
    for name in ("o'brien", 'say "hi"', "both'\"", "plain"):
        register_artifact_dir(uri, run, "export", name, "a", once=True)
        register_artifact_dir(uri, run, "export", name, "a", once=True)   # once: the version is reused
    assert main(["registry", "list", "--uri", uri]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in ("o'brien", 'say "hi"', "both'\"", "plain"))
    assert [str(mv.version) for mv in versions_where(c, name="both'\"")] == ["1"]
    assert [str(mv.version) for mv in versions_where(c, name="o'brien", run_id=run)] == ["1"]
