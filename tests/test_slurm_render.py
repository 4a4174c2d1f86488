"""Rendered sbatch scripts and `hibert submit --dry-run` (no Slurm needed)."""
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from hibert.cli import main
from hibert.config import ConfigError, load_config
from hibert.config.ops import SlurmResources
from slurm.render import JobSpec, Raw, render_job, sbatch_options
from slurm.stages import plan


def spec(**res) -> JobSpec:
    return JobSpec(name="demo-pretrain", command=["python", "-m", "hibert.cli", "pretrain", "a b.yaml", "x=1"],
                   resources=SlurmResources(**res), log_dir=Path("/logs"), workdir=Path("/work"))


def header(script: str) -> list[str]:
    return [line[len("#SBATCH "):] for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_multinode_gpu_header():
    r = dict(nodes=4, gpus_per_node=8, cpus_per_task=12, partition="gpu", account="nlp", qos="high",
             time="48:00:00", mem="480G", signal_grace_s=300, extra_sbatch=["--exclusive", "constraint=a100"])
    lines = header(render_job(spec(**r)))
    for want in ["--job-name=demo-pretrain", "--nodes=4", "--ntasks-per-node=8", "--gpus-per-node=8",
                 "--cpus-per-task=12", "--partition=gpu", "--account=nlp", "--qos=high", "--time=48:00:00",
                 "--mem=480G", "--signal=B:USR1@300", "--requeue", "--open-mode=append",
                 "--output=/logs/%x-%j.out", "--error=/logs/%x-%j.err", "--chdir=/work", "--exclusive",
                 "--constraint=a100", "--kill-on-invalid-dep=yes"]:
        assert want in lines, want
    assert not any(line.startswith("--array") for line in lines)


def test_cpu_cluster_has_no_gpu_lines_and_defaults_are_left_out():
    script = render_job(spec(gpus_per_node=0, requeue=False))
    assert "--gpus" not in script
    lines = header(script)
    assert "--ntasks-per-node=1" in lines and "--no-requeue" in lines
    assert not any(line.startswith(("--partition", "--account", "--qos", "--mem")) for line in lines)
    assert "REQUEUE=0" in script


def test_srun_line_quotes_the_command_and_keeps_shell_expansions():
    s = JobSpec(name="p", command=["hibert", "prep", "my recipe.yaml", "--shard-index", Raw('"$SLURM_ARRAY_TASK_ID"')],
                resources=SlurmResources(gpus_per_node=2, cpus_per_task=4, container="nvcr.io/x:1",
                                         srun_args=["--container-mounts=/data:/data"]),
                log_dir=Path("/l"), workdir=Path("/w"))
    srun = next(line for line in render_job(s).splitlines() if line.startswith("srun "))
    assert srun == ("srun --nodes=1 --ntasks-per-node=2 --cpus-per-task=4 --kill-on-bad-exit=0 "
                    "--container-image=nvcr.io/x:1 --container-mounts=/data:/data "
                    "hibert prep 'my recipe.yaml' --shard-index \"$SLURM_ARRAY_TASK_ID\" &")


def test_environment_setup_and_signal_forwarding_body():
    script = render_job(spec(env={"NCCL_DEBUG": "INFO", "WEIRD": "a b'c"}, setup=["module load cuda/12.4",
                                                                                 "source /venv/bin/activate"]))
    for want in ["export PYTHONUNBUFFERED=1", 'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
                 "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "export TORCH_DISTRIBUTED_DEBUG=OFF",
                 "module load cuda/12.4\nsource /venv/bin/activate\n", "trap 'forward_signal USR1' USR1",
                 'kill -s "$1" "$STEP_PID"', 'scontrol requeue "$SLURM_JOB_ID"', "REQUEUE_EXIT_CODE=75",
                 'export MASTER_PORT=$((10000 + SLURM_JOB_ID % 50000))', "export WEIRD='a b'\"'\"'c'"]:
        assert want in script, want
    # user env comes after the defaults, so it wins
    assert script.index("export NCCL_DEBUG=WARN") < script.index("export NCCL_DEBUG=INFO")
    assert script.index("trap 'forward_signal USR1'") < script.index("\nsrun ")  # no window without the trap


def test_rendered_script_is_valid_bash(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(render_job(spec(env={"A": "1"}, setup=["true"])))
    out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_paths_with_whitespace_are_refused():
    bad = JobSpec(name="x", command=["true"], resources=SlurmResources(), log_dir=Path("/a b"), workdir=Path("/w"))
    with pytest.raises(ValueError, match="whitespace"):
        sbatch_options(bad)


def test_bad_stage_resources_fail_at_load_time():
    with pytest.raises(ConfigError, match="gpus_per_nod"):
        load_config(None, ["slurm.pipeline=[{name: a, command: pretrain, resources: {gpus_per_nod: 2}}]"])
    with pytest.raises(ConfigError, match="earlier stages"):
        load_config(None, ["slurm.pipeline=[{name: a, command: pretrain, after: [b]}, {name: b, command: finetune}]"])


def test_default_chain(tmp_path):
    cfg = load_config("giga-cm", ["slurm.prep_shards=16", "slurm.array_parallelism=4"])
    jobs = plan(cfg, "giga-cm", ["slurm.prep_shards=16", "slurm.array_parallelism=4"], tmp_path, tmp_path)
    assert [(j.stage.name, j.after) for j in jobs] == [
        ("prep", []), ("prep-merge", ["prep"]), ("pretrain-open", ["prep-merge"]),
        ("pretrain-in", ["pretrain-open"]), ("finetune", ["pretrain-in"]), ("evaluate", ["finetune"])]
    by = {j.stage.name: j.spec for j in jobs}
    assert by["prep"].array == "0-15%4"
    prep = render_job(by["prep"])
    assert "--shard-index \"$SLURM_ARRAY_TASK_ID\"" in prep and "--num-shards 16" in prep
    assert "--output=" + str(tmp_path) + "/%x-%A_%a.out" in header(prep) and "--gpus" not in prep
    assert "--merge --num-shards 16" in render_job(by["prep-merge"])
    pre = header(render_job(by["pretrain-open"]))
    assert {"--nodes=4", "--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=12"} <= set(pre)
    # each stage its own run (no resuming another stage's checkpoints), the encoder handed on by alias
    assert "run.name=giga-cm-open-in-domain" in by["pretrain-in"].command
    assert "run.init=models:/hibert-encoder@open-domain" in by["pretrain-in"].command
    assert "run.init=models:/hibert-encoder@in-domain" in by["finetune"].command
    assert {"--nodes=1", "--gpus-per-node=1", "--ntasks-per-node=1"} <= set(header(render_job(by["evaluate"])))


def test_prep_array_follows_data_num_shards(tmp_path):
    cases = [([], "0-0"), (["data.num_shards=5"], "0-4"), (["data.num_shards=5", "slurm.prep_shards=3"], "0-2")]
    for overrides, array in cases:
        jobs = plan(load_config(None, overrides), None, overrides, tmp_path, tmp_path, ["prep", "prep-merge"])
        assert jobs[0].spec.array == array
        assert jobs[1].spec.command[-2:] == ["--num-shards", str(int(array.split("-")[1]) + 1)]


def write_recipe(tmp_path: Path) -> Path:
    (tmp_path / "cnndm.yaml").write_text(yaml.safe_dump({"run": {"name": "cnndm"}, "model": "hibert_tiny"}))
    recipe = {
        "run": {"name": "chain"},
        "model": "hibert_tiny",
        "slurm": {
            "nodes": 2, "gpus_per_node": 4, "cpus_per_task": 6, "partition": "gpu", "prep_shards": 3,
            "setup": ["source /opt/venv/bin/activate"], "cli": "hibert",
            "pipeline": [
                {"name": "prep", "command": "prep"},
                {"name": "prep-cnndm", "command": "prep", "recipe": "cnndm.yaml", "after": []},
                {"name": "merge", "command": "prep-merge", "after": ["prep"]},
                {"name": "merge-cnndm", "command": "prep-merge", "recipe": "cnndm.yaml", "after": ["prep-cnndm"]},
                {"name": "open", "command": "pretrain", "after": ["merge"],
                 "overrides": ["run.stage=open-domain"]},
                {"name": "in", "command": "pretrain", "recipe": "cnndm.yaml", "after": ["open", "merge-cnndm"],
                 "overrides": ["run.stage=in-domain", "run.init=models:/hibert-encoder@open-domain"],
                 "resources": {"nodes": 1, "time": "04:00:00"}},
                {"name": "evaluate", "command": "evaluate", "recipe": "cnndm.yaml"},
            ],
        },
    }
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def stage_blocks(out: str) -> dict[str, str]:
    parts = re.split(r"^# ===== stage (\S+) \(afterok: ([^)]*)\).*$", out, flags=re.M)
    return {parts[i]: (parts[i + 1], parts[i + 2]) for i in range(1, len(parts), 3)}


def test_submit_dry_run_prints_the_chain(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    assert main(["submit", str(recipe), "model.hidden=64", "--dry-run", "--out-dir", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    blocks = stage_blocks(out)
    assert list(blocks) == ["prep", "prep-cnndm", "merge", "merge-cnndm", "open", "in", "evaluate"]
    assert {k: v[0] for k, v in blocks.items()} == {
        "prep": "none", "prep-cnndm": "none", "merge": "prep", "merge-cnndm": "prep-cnndm", "open": "merge",
        "in": "open, merge-cnndm", "evaluate": "in"}
    cnndm = str((tmp_path / "cnndm.yaml").resolve())
    open_srun = next(line for line in blocks["open"][1].splitlines() if line.startswith("srun"))
    assert f"hibert pretrain {recipe.resolve()} model.hidden=64 run.stage=open-domain &" in open_srun
    in_block = blocks["in"][1]
    # a stage with its own recipe gets only its own overrides; resources are the stage's
    assert f"hibert pretrain {cnndm} run.stage=in-domain run.init=models:/hibert-encoder@open-domain &" in in_block
    assert "#SBATCH --nodes=1" in in_block and "#SBATCH --time=04:00:00" in in_block
    assert "#SBATCH --nodes=2" in blocks["open"][1] and "#SBATCH --gpus-per-node=4" in blocks["open"][1]
    assert "#SBATCH --array=0-2" in blocks["prep"][1]
    assert "source /opt/venv/bin/activate" in blocks["evaluate"][1]
    assert not (tmp_path / "o").exists()  # a dry run writes nothing


def test_submit_stage_subset_drops_dependencies_on_left_out_stages(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    assert main(["submit", str(recipe), "--dry-run", "--stages", "in,evaluate"]) == 0
    blocks = stage_blocks(capsys.readouterr().out)
    assert {k: v[0] for k, v in blocks.items()} == {"in": "none", "evaluate": "in"}


def test_submit_reports_bad_stage_names_and_overrides(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    assert main(["submit", str(recipe), "--dry-run", "--stages", "nope"]) == 2
    assert "unknown stages ['nope']" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"slurm": {"pipeline": [{"name": "p", "command": "pretrain",
                                                           "overrides": ["model.hiden=3"]}]}}))
    assert main(["submit", str(bad), "--dry-run"]) == 2
    assert "model.hidden" in capsys.readouterr().err  # the stage's config is validated before submitting
