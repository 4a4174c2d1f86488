"""Rendered sbatch scripts and `hibert submit --dry-run` (no Slurm needed)."""
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from hibert.cli import main
from hibert.config import ConfigError, load_config
from hibert.config.ops import SlurmResources
from hibert.slurm.render import JobSpec, Raw, render_job, sbatch_options
from hibert.slurm.stages import plan


@pytest.fixture(autouse=True)
def _dry_run_snapshots_in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


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
    overrides = ["run.name=base", "slurm.nodes=4", "slurm.gpus_per_node=8", "slurm.cpus_per_task=12",
                 "slurm.prep_shards=16", "slurm.array_parallelism=4"]
    chain = plan(load_config(None, overrides), None, overrides, tmp_path, tmp_path, chain_id="base-c1")
    jobs = chain.jobs
    assert [(j.stage.name, j.after) for j in jobs] == [
        ("prep", []), ("prep-merge", ["prep"]), ("pretrain-open", ["prep-merge"]),
        ("pretrain-in", ["pretrain-open"]), ("finetune", ["pretrain-in"]), ("evaluate", ["finetune"])]
    by = {j.stage.name: j for j in jobs}
    assert by["prep"].spec.array == "0-15%4"
    prep = render_job(by["prep"].spec)
    assert "--shard-index \"$SLURM_ARRAY_TASK_ID\"" in prep and "--num-shards 16" in prep
    assert "--output=" + str(tmp_path) + "/%x-%A_%a.out" in header(prep) and "--gpus" not in prep
    assert "--merge --num-shards 16" in render_job(by["prep-merge"].spec)
    pre = header(render_job(by["pretrain-open"].spec))
    assert {"--nodes=4", "--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=12"} <= set(pre)
    # every job runs its snapshot, nothing else: `hibert <command> <out-dir>/<chain id>/<stage>.yaml`
    for j in jobs:
        assert j.snapshot == tmp_path / "base-c1" / f"{j.stage.name}.yaml"
        sub = "prep" if j.stage.command == "prep-merge" else j.stage.command
        assert j.spec.command[3:5] == [sub, str(j.snapshot)], j.spec.command
    # each stage its own run (no resuming another stage's checkpoints), the encoder handed on by the chain's alias
    cfgs = {n: j.config for n, j in by.items()}
    assert cfgs["pretrain-in"].run.name == "base-in-domain-base-c1"  # per chain: never another chain's run dir
    assert cfgs["evaluate"].run.name == cfgs["finetune"].run.name
    assert cfgs["pretrain-open"].tracking.alias == "open-domain-base-c1"
    assert cfgs["pretrain-in"].run.init == "models:/hibert-encoder@open-domain-base-c1"
    assert cfgs["pretrain-in"].tracking.alias == "in-domain-base-c1"
    assert cfgs["finetune"].run.init == "models:/hibert-encoder@in-domain-base-c1"
    assert cfgs["finetune"].tracking.alias == "finetuned-base-c1"
    assert cfgs["prep"].tracking.alias is None and cfgs["evaluate"].tracking.alias is None
    assert {"--nodes=1", "--gpus-per-node=1", "--ntasks-per-node=1"} <= set(header(render_job(by["evaluate"].spec)))


def test_prep_array_follows_data_num_shards(tmp_path):
    cases = [([], "0-0"), (["data.num_shards=5"], "0-4"), (["data.num_shards=5", "slurm.prep_shards=3"], "0-2")]
    for overrides, array in cases:
        jobs = plan(load_config(None, overrides), None, overrides, tmp_path, tmp_path, ["prep", "prep-merge"]).jobs
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


def snapshot_dir(out: str) -> Path:
    m = re.search(r"^# chain (\S+) \(dry run: snapshots in (\S+),", out, flags=re.M)
    assert m, out[:500]
    return Path(m.group(2))


def srun_line(block: str) -> str:
    return next(line for line in block.splitlines() if line.startswith("srun"))


def test_submit_dry_run_prints_the_chain(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    assert main(["submit", str(recipe), "model.hidden=96", "--dry-run", "--out-dir", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    blocks = stage_blocks(out)
    assert list(blocks) == ["prep", "prep-cnndm", "merge", "merge-cnndm", "open", "in", "evaluate"]
    assert {k: v[0] for k, v in blocks.items()} == {
        "prep": "none", "prep-cnndm": "none", "merge": "prep", "merge-cnndm": "prep-cnndm", "open": "merge",
        "in": "open, merge-cnndm", "evaluate": "in"}
    snaps = snapshot_dir(out)
    assert snaps.parent.name.startswith("hibert-submit-dry-run-") and snaps.name.startswith("chain-")
    cnndm = str((tmp_path / "cnndm.yaml").resolve())
    # the job runs the snapshot; the comment keeps the command it was resolved from
    assert srun_line(blocks["open"][1]).endswith(f"hibert pretrain {snaps / 'open.yaml'} &")
    assert f"hibert pretrain {recipe.resolve()} model.hidden=96 run.stage=open-domain\n" in blocks["open"][1]
    assert srun_line(blocks["prep"][1]).endswith(
        f"hibert prep {snaps / 'prep.yaml'} --num-shards 3 --shard-index \"$SLURM_ARRAY_TASK_ID\" &")
    open_cfg = load_config(snaps / "open.yaml")
    assert open_cfg.model.hidden == 96 and open_cfg.run.stage == "open-domain"
    in_block = blocks["in"][1]
    # a stage with its own recipe gets only its own overrides; resources are the stage's
    assert f"hibert pretrain {cnndm} run.stage=in-domain run.init=models:/hibert-encoder@open-domain\n" in in_block
    in_cfg = load_config(snaps / "in.yaml")
    assert in_cfg.model.hidden != 96 and in_cfg.run.name == f"cnndm-{snaps.name}"
    assert in_cfg.run.init == f"models:/hibert-encoder@{open_cfg.tracking.alias}"
    assert open_cfg.tracking.alias == f"open-domain-{snaps.name}" and in_cfg.tracking.alias == f"in-domain-{snaps.name}"
    assert "#SBATCH --nodes=1" in in_block and "#SBATCH --time=04:00:00" in in_block
    assert "#SBATCH --nodes=2" in blocks["open"][1] and "#SBATCH --gpus-per-node=4" in blocks["open"][1]
    assert "#SBATCH --array=0-2" in blocks["prep"][1]
    assert "source /opt/venv/bin/activate" in blocks["evaluate"][1]
    assert not (tmp_path / "o").exists()  # a dry run writes nothing to the out-dir


def test_submit_stage_subset_drops_dependencies_on_left_out_stages(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    # `in` reads what the left-out `open` registers: which chain's? Refused without --chain
    assert main(["submit", str(recipe), "--dry-run", "--stages", "in,evaluate"]) == 2
    err = capsys.readouterr().err
    assert "stage in reads models:/hibert-encoder@open-domain, which stage open registers" in err and "--chain" in err
    assert main(["submit", str(recipe), "--dry-run", "--stages", "in,evaluate", "--chain", "chain-x1", "--no-pin"]) == 0
    out = capsys.readouterr().out
    blocks = stage_blocks(out)
    assert {k: v[0] for k, v in blocks.items()} == {"in": "none", "evaluate": "in"}
    assert load_config(snapshot_dir(out) / "in.yaml").run.init == "models:/hibert-encoder@open-domain-chain-x1"


def test_left_out_stage_is_taken_as_done_but_what_it_waited_for_still_comes_first(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    assert main(["submit", str(recipe), "--dry-run", "--stages", "prep,open,evaluate"]) == 0
    blocks = stage_blocks(capsys.readouterr().out)
    # open waited for merge (left out), which waited for prep; evaluate waited for in (left out) <- open
    assert {k: v[0] for k, v in blocks.items()} == {"prep": "none", "open": "prep", "evaluate": "open"}


def test_submit_reports_bad_stage_names_and_overrides(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    assert main(["submit", str(recipe), "--dry-run", "--stages", "nope"]) == 2
    assert "unknown stages ['nope']" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"slurm": {"pipeline": [{"name": "p", "command": "pretrain",
                                                           "overrides": ["model.hiden=3"]}]}}))
    assert main(["submit", str(bad), "--dry-run", "--no-pin"]) == 2
    assert "model.hidden" in capsys.readouterr().err  # the stage's config is validated before submitting


def test_paper_recipe_gives_each_stage_its_own_data(capsys):
    """giga-cm (Zhang et al. 2019, §4): open-domain pretraining on GIGA-CM (Gigaword + CNN/DM train),
    in-domain pretraining and finetuning on CNN/DM only, one tokenizer."""
    assert main(["submit", "giga-cm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    snaps = snapshot_dir(out)
    assert list(stage_blocks(out)) == ["prep-giga-cm", "prep-giga-cm-merge", "prep-cnndm", "prep-cnndm-merge",
                                       "pretrain-open", "pretrain-in", "finetune", "evaluate"]
    cfg = {n: load_config(snaps / f"{n}.yaml") for n in stage_blocks(out)}

    def formats(name: str) -> list[tuple[str, str | None]]:
        return [(s.format, s.split) for s in cfg[name].data.sources]

    giga_cm = [("gigaword", "train"), ("cnndm", "train"), ("cnndm", "valid")]
    cnndm = [("cnndm", "train"), ("cnndm", "valid"), ("cnndm", "test")]
    assert formats("prep-giga-cm") == formats("pretrain-open") == giga_cm
    for stage in ("prep-cnndm", "pretrain-in", "finetune", "evaluate"):
        assert formats(stage) == cnndm, stage
    assert cfg["pretrain-open"].data.dataset_dir != cfg["pretrain-in"].data.dataset_dir
    assert cfg["pretrain-in"].data.dataset_dir == cfg["finetune"].data.dataset_dir == cfg["evaluate"].data.dataset_dir
    # CNN/DM is encoded with the tokenizer trained on GIGA-CM
    assert cfg["prep-cnndm"].data.tokenizer.model == f"{cfg['prep-giga-cm'].data.output}/tokenizer.model"
    assert cfg["prep-giga-cm"].data.tokenizer.model is None
    # the paper's hyper-parameters (§4.2)
    for stage in ("pretrain-open", "pretrain-in", "finetune"):
        c = cfg[stage]
        assert (c.model.hidden, c.model.layers, c.model.heads, c.model.dropout) == (768, 6, 12, 0.1), stage
        assert (c.optimizer.betas, c.optimizer.weight_decay, c.schedule.decay) == ((0.9, 0.999), 0.01, "inverse_sqrt")
    for stage in ("pretrain-open", "pretrain-in"):
        assert (cfg[stage].optimizer.lr, cfg[stage].schedule.warmup_steps) == (1e-4, 10000)
    assert cfg["pretrain-open"].schedule.epochs == 45 and cfg["pretrain-in"].schedule.epochs == 200
    ft = cfg["finetune"]
    assert (ft.optimizer.lr, ft.schedule.max_docs_per_batch, ft.schedule.warmup_steps, ft.schedule.epochs) == \
        (5e-5, 32, 4000, 5)
    assert "#SBATCH --gpus-per-node=1" in stage_blocks(out)["finetune"][1]
    assert cfg["evaluate"].run.name == ft.run.name != cfg["pretrain-in"].run.name
    # and the encoders go open -> in -> finetune through this chain's aliases
    assert cfg["pretrain-in"].run.init == f"models:/hibert-encoder@{cfg['pretrain-open'].tracking.alias}"
    assert ft.run.init == f"models:/hibert-encoder@{cfg['pretrain-in'].tracking.alias}"


def test_finetuning_on_data_without_summaries_is_refused(tmp_path, capsys):
    # the paper recipe as it was: no pipeline, so every stage (finetune too) reads Gigaword + CNN/DM
    old = tmp_path / "old-giga-cm.yaml"
    old.write_text(yaml.safe_dump({
        "run": {"name": "giga-cm-open"},
        "data": {"sources": [{"format": "gigaword", "path": "/data/gigaword/data/*/*.gz"},
                             {"format": "cnndm", "path": "/data/cnndm/stories/*.story", "split": "train"}]}}))
    for dry in (["--dry-run"], []):  # refused before anything is written or submitted
        assert main(["submit", str(old), "--out-dir", str(tmp_path / "o"), *dry]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert "stage finetune (hibert finetune) needs documents with summaries" in err
        assert "gigaword:/data/gigaword/data/*/*.gz (no summaries), cnndm:/data/cnndm/stories/*.story" in err
    assert not (tmp_path / "o").exists()
    # a pipeline stage whose own data lacks summaries: text, or jsonl without summary_field
    text = ("{format: text, path: /data/plain.txt}", "text:/data/plain.txt (no summaries)")
    jsonl = ("{format: jsonl, path: /data/a.jsonl}", "jsonl:/data/a.jsonl (no summaries)")
    def finetune_on(source: str) -> str:
        return f"slurm.pipeline=[{{name: finetune, command: finetune, overrides: ['data.sources=[{source}]']}}]"

    for source, shown in (text, jsonl):
        assert main(["submit", "giga-cm", "--dry-run", finetune_on(source)]) == 2
        assert shown in capsys.readouterr().err
    ok = "{format: jsonl, path: /a.jsonl, summary_field: s}"
    assert main(["submit", "giga-cm", "--dry-run", finetune_on(ok)]) == 0


def test_seeds_repeat_finetune_and_evaluate_stages():
    """slurm.seeds: each finetune/evaluate stage once per seed, its run named <run.name>-seed<S>, the same
    seed's evaluate after it; pretraining stays one run; only the first seed registers."""
    from hibert.config.ops import SlurmStage
    from hibert.slurm.chain import dependency_closure
    from hibert.slurm.stages import expand_seeds

    stages = [SlurmStage(name="pre", command="pretrain", overrides=["run.name=pre"]),
              SlurmStage(name="ft", command="finetune", overrides=["run.name=ext"]),
              SlurmStage(name="ev", command="evaluate", overrides=["run.name=ext"], after=["ft"]),
              SlurmStage(name="ft-abs", command="finetune", after=["pre"]),
              SlurmStage(name="report", command="evaluate", recipe="x", after=[]),
              SlurmStage(name="merge", command="prep-merge", after=["ft"]),
              SlurmStage(name="ft2", command="finetune", after=["pre"]),
              SlurmStage(name="ev2", command="evaluate"),      # after the stage before it: ft2
              SlurmStage(name="tail", command="prep-merge")]  # after every copy of ev2
    out = {s.name: s for s in expand_seeds(stages, [7, 8], "demo")}
    assert list(out) == ["pre", "ft-seed7", "ft-seed8", "ev-seed7", "ev-seed8", "ft-abs-seed7", "ft-abs-seed8",
                         "report-seed7", "report-seed8", "merge", "ft2-seed7", "ft2-seed8", "ev2-seed7",
                         "ev2-seed8", "tail"]
    # not "the stage before it" once expanded (ft2-seed8, then ev2-seed7): its own seed's finetune
    assert out["ev2-seed7"].after == ["ft2-seed7"] and out["tail"].after == ["ev2-seed7", "ev2-seed8"]
    assert out["ft-seed7"].after == ["pre"]
    closure = dependency_closure(list(out.values()))
    assert closure["ev2-seed7"] == {"ft2-seed7", "pre"}
    assert out["ft-seed8"].overrides == ["run.name=ext", "run.seed=8", "schedule.seed=8", "run.name=ext-seed8",
                                         "tracking.register_model=false"]
    assert "tracking.register_model=false" not in out["ft-seed7"].overrides
    assert out["ev-seed8"].after == ["ft-seed8"] and out["ev-seed8"].overrides[-1] == "run.name=ext-seed8"
    assert out["ft-abs-seed7"].after == ["pre"] and out["ft-abs-seed7"].overrides[-1] == "run.name=demo-seed7"
    assert out["merge"].after == ["ft-seed7", "ft-seed8"] and out["pre"].overrides == ["run.name=pre"]
    assert expand_seeds(stages, [], "demo") == stages   # no seeds: the chain as written
    with pytest.raises(ValueError, match="repeated"):
        expand_seeds(stages, [1, 1], "demo")
    cfg = load_config("demo", ["slurm.seeds=[1,2,3]"])
    assert cfg.slurm.seeds == [1, 2, 3]


def test_summarize_stages_are_an_array_then_a_merge_reading_the_chains_model(tmp_path):
    """A finetune -> summarize (array of slurm.summarize_shards tasks, --shard I/N) -> summarize-merge chain: the
    summarize stage's --model names the alias the finetune stage registers, which the chain rewrites to its own."""
    recipe = {"run": {"name": "corp"}, "model": "hibert_tiny", "slurm": {
        "gpus_per_node": 4, "summarize_shards": 3, "array_parallelism": 2, "pipeline": [
            {"name": "ft", "command": "finetune"},
            {"name": "sum", "command": "summarize", "args": [
                "--model", "models:/hibert-extractive@finetuned", "--input", "/data/news.jsonl",
                "--output", "/data/news.summaries.jsonl", "--k", "3"]},
            {"name": "sum-merge", "command": "summarize-merge", "args": [
                "--input", "/data/news.jsonl", "--output", "/data/news.summaries.jsonl"]}]}}
    path = tmp_path / "corp.yaml"
    path.write_text(yaml.safe_dump(recipe))
    chain = plan(load_config(path, []), str(path), [], tmp_path, tmp_path, pin=False)
    jobs = {j.stage.name: j for j in chain.jobs}
    words = [str(w) for w in jobs["sum"].spec.command]
    assert jobs["sum"].spec.array == "0-2%2" and jobs["sum"].spec.resources.gpus_per_node == 1
    assert words[words.index("--model", words.index("--k")) + 1] == f"models:/hibert-extractive@finetuned-{chain.id}"
    assert words[-2:] == ["--shard", '"$SLURM_ARRAY_TASK_ID/3"'] and words[3] == "summarize"
    assert jobs["sum"].after == ["ft"] and jobs["sum-merge"].after == ["sum"]
    merge = [str(w) for w in jobs["sum-merge"].spec.command]
    assert merge[-3:] == ["--merge", "--shards", "3"] and jobs["sum-merge"].spec.array is None
    assert jobs["sum-merge"].spec.resources.gpus_per_node == 0
    bad = {**recipe, "slurm": {"pipeline": [{"name": "s", "command": "summarize", "args": ["--input", "x.jsonl"]}]}}
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match="args need --output"):
        load_config(path, [])


def test_no_value_reaches_the_script_as_a_line_of_its_own(tmp_path):
    """A newline in a value must not end a comment or an #SBATCH line of the rendered script (the next line
    would run): overrides with control characters are refused at load time, a description keeps one comment
    line, a job name or sbatch option with one is refused."""
    with pytest.raises(ConfigError, match="control character"):
        load_config(None, ["run.output_dir=/tmp/o\ntouch /tmp/pwned #"])
    script = render_job(JobSpec(name="x", command=["true"], resources=SlurmResources(), log_dir=Path("/logs"),
                                workdir=Path("/w"), description="stage a\ntouch /tmp/pwned #"))
    assert "# stage a touch /tmp/pwned #" in script and "\ntouch /tmp/pwned" not in script
    with pytest.raises(ValueError, match="control character"):
        render_job(JobSpec(name="x\nid", command=["true"], resources=SlurmResources(), log_dir=Path("/logs"),
                           workdir=Path("/w")))


@pytest.mark.parametrize("evil", ["o$(touch${IFS}PWNED)", "o`touch${IFS}PWNED`", "o'$(touch${IFS}PWNED)'",
                                  'o"$(touch${IFS}PWNED)"', "o;touch${IFS}PWNED"])
def test_no_value_runs_as_a_command_when_the_script_runs(tmp_path, evil):
    """Paths and names are data in the rendered script: run it with stub srun (a failed step, so the crash
    count file is written) and scontrol, and nothing in them executes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("srun", "exit 1"), ("scontrol", 'echo "$@" >> "$STUB_LOG"')):
        (bin_dir / tool).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    logs = tmp_path / evil / "slurm"
    logs.mkdir(parents=True)
    script = tmp_path / "job.sbatch"
    script.write_text(render_job(JobSpec(name=f"job-{evil}", command=["true", evil], resources=SlurmResources(),
                                         log_dir=logs, workdir=tmp_path / evil)))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n1",
           "STUB_LOG": str(tmp_path / "scontrol.log")}
    out = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert not list(tmp_path.rglob("PWNED")), out.stdout + out.stderr
    assert (logs / ".restarts-42").read_text().strip() == "1"      # the count file at its literal path
    assert f"(job-{evil})" in out.stdout and "requeue 42" in (tmp_path / "scontrol.log").read_text()


def test_a_path_sbatch_cannot_hold_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """A working directory with a space, or a newline in a recipe's output_dir, was a ValueError traceback at
    render time; now `hibert submit` says it in one line and writes nothing."""
    recipe = write_recipe(tmp_path)
    spaced = tmp_path / "a b"
    spaced.mkdir()
    monkeypatch.chdir(spaced)
    assert main(["submit", str(recipe), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "whitespace" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(recipe.read_text())
    data["run"]["output_dir"] = str(tmp_path / "o\nid")
    bad = tmp_path / "nl.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["submit", str(bad), "--dry-run", "--no-pin"]) == 2
    err = capsys.readouterr().err
    assert "cannot contain whitespace" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
