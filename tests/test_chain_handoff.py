"""Stage hand-off through the registry must not race: two chains on ONE MLflow store, interleaved.

`hibert submit` runs for real (a stand-in `sbatch` on PATH hands out job ids), so the chain ids,
jobs.json and the per-stage snapshots are the ones a cluster would run. The stages' registry side is
the real one on a real sqlite store: what a stage registers under comes from its snapshot through the
real `Task.registry_name/registry_alias`, and `hibert.registry.register_artifact_dir`; what a stage starts
from is its snapshot's `run.init`, resolved by `hibert.registry.resolve_model` as `hibert.runtime.run.load_init`
does. Only the training is left out: the exports are tiny directories that say which chain wrote them.
"""
import itertools
import json
import os
import socket
import stat
from pathlib import Path

import pytest
import yaml

from hibert.cli import main
from hibert.config import Config, load_config
from hibert.registry import artifact_location, client, register_artifact_dir, resolve_model, tracking_uri

pytestmark = pytest.mark.timeout(120)

PIPELINE = [
    {"name": "pretrain-open", "command": "pretrain", "overrides": ["run.stage=open-domain", "run.name=open"]},
    {"name": "pretrain-in", "command": "pretrain",
     "overrides": ["run.stage=in-domain", "run.name=in", "run.init=models:/hibert-encoder@open-domain"]},
    {"name": "finetune", "command": "finetune",
     "overrides": ["run.name=ft", "run.init=models:/hibert-encoder@in-domain"]},
    {"name": "evaluate", "command": "evaluate", "overrides": ["run.name=ft"]},
]


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A stand-in sbatch on PATH, MLflow's process-wide URI undone at teardown."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/bash\nn=$(( $(cat {tmp_path}/jobid 2>/dev/null || echo 100) + 1 ))\n'
                      f'echo $n > {tmp_path}/jobid\necho "$n;cluster"\n')
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # resolve_model exports them: undo at teardown
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    import mlflow

    mlflow.set_tracking_uri(None)  # MLflow's in-process default ("" would mean a file store in the cwd)


def recipe(tmp_path, uri: str, pipeline=PIPELINE, name: str = "two") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "run": {"name": name, "output_dir": str(tmp_path / "runs")}, "model": "hibert_tiny",
        "tracking": {"uri": uri, "experiment": "handoff"},
        "slurm": {"gpus_per_node": 0, "cli": "hibert", "pipeline": pipeline}}, sort_keys=False))
    return str(path)


def submit(*args: str) -> dict:
    assert main(["submit", *args]) == 0
    out_dir = args[args.index("--out-dir") + 1]
    return json.loads((Path(out_dir) / "jobs.json").read_text())


def snapshot(jobs: dict, stage: str):
    return load_config(jobs["stages"][stage]["snapshot"])


def registry_of(command: str, cfg) -> tuple[str, str | None]:
    """(model, alias) the stage's run registers, from the real tasks (hibert/runtime/publish.py calls these):
    `hibert pretrain` trains the masked-sentence task, `hibert finetune` the one `finetune.task` names."""
    from hibert.pretrain.masked_sentence import MaskedSentenceTask

    cls = MaskedSentenceTask
    if command == "finetune":
        kind = getattr(getattr(cfg, "finetune", None), "task", "extractive")
        if kind == "abstractive":
            from hibert.finetune.abstractive.task import AbstractiveTask as cls
        else:
            from hibert.finetune.extractive.task import ExtractiveTask as cls
    task = object.__new__(cls)
    return task.registry_name(cfg), task.registry_alias(cfg)


def publish(cfg, tag: str, tmp_path, command: str = "pretrain") -> str:
    """What the end of a training run does to the registry: log the export, register it under the alias."""
    uri = tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    export = tmp_path / "exports" / tag
    export.mkdir(parents=True)
    (export / "export.json").write_text(json.dumps({"written_by": tag}))
    c = client(uri)
    exp = c.get_experiment_by_name(cfg.tracking.experiment)
    exp_id = exp.experiment_id if exp else c.create_experiment(cfg.tracking.experiment, artifact_location(uri))
    run_id = c.create_run(exp_id).info.run_id
    c.log_artifacts(run_id, str(export), "export")
    c.set_terminated(run_id)
    name, alias = registry_of(command, cfg)
    return register_artifact_dir(uri, run_id, "export", name, alias, also=cfg.tracking.also_aliases)


_starts = itertools.count()


def start(cfg, tmp_path) -> str:
    """What the start of a training run does with run.init (hibert.runtime.run.load_init): which export it gets."""
    dst = tmp_path / "init" / f"{cfg.run.name}-{next(_starts)}"
    dst.mkdir(parents=True)
    local = resolve_model(cfg.run.init, tracking_uri(cfg.tracking.uri, cfg.run.output_dir), dst)
    return json.loads((local / "export.json").read_text())["written_by"]


def test_two_interleaved_chains_on_one_store_each_read_their_own_encoders(env, capsys):
    uri = f"sqlite:///{env / 'mlflow.db'}"
    rec = recipe(env, uri)
    a = submit(rec, "--out-dir", str(env / "a"))
    b = submit(rec, "--out-dir", str(env / "b"))  # queued behind A, same recipe, same store
    printed = capsys.readouterr().out
    assert a["chain_id"] != b["chain_id"]
    assert f"chain {a['chain_id']}" in printed and f"chain {b['chain_id']}" in printed
    assert list(a["jobs"]) == ["pretrain-open", "pretrain-in", "finetune", "evaluate"]
    A = {s: snapshot(a, s) for s in a["jobs"]}
    B = {s: snapshot(b, s) for s in b["jobs"]}

    # open-domain: A registers, then B (B's version is the newer one)
    va = publish(A["pretrain-open"], "A-open", env)
    vb = publish(B["pretrain-open"], "B-open", env)
    assert int(vb) > int(va)
    # in-domain: each chain starts from its own open-domain encoder
    assert start(A["pretrain-in"], env) == "A-open"
    assert start(B["pretrain-in"], env) == "B-open"
    # ... and registers in the other order; finetuning still gets its own chain's in-domain encoder
    publish(B["pretrain-in"], "B-in", env)
    publish(A["pretrain-in"], "A-in", env)
    assert start(B["finetune"], env) == "B-in"
    assert start(A["finetune"], env) == "A-in"
    publish(A["finetune"], "A-ft", env, "finetune")

    # every chain alias belongs to one chain; the plain aliases (for people) follow the newest version
    # and are never what a chain reads
    aliases = {m.name: dict(m.aliases) for m in client(uri).search_registered_models()}
    assert set(aliases["hibert-encoder"]) == {f"{s}-{c}" for s in ("open-domain", "in-domain")
                                              for c in (a["chain_id"], b["chain_id"])} | {"open-domain", "in-domain"}
    assert aliases["hibert-encoder"]["open-domain"] == aliases["hibert-encoder"][f"open-domain-{b['chain_id']}"]
    assert aliases["hibert-encoder"]["in-domain"] == aliases["hibert-encoder"][f"in-domain-{a['chain_id']}"]
    assert set(aliases["hibert-extractive"]) == {f"finetuned-{a['chain_id']}", "finetuned"}
    assert all("@open-domain" not in str(st.get("reads")) or a["chain_id"] in str(st.get("reads"))
               for st in a["stages"].values())
    assert a["stages"]["pretrain-in"]["registers"] == f"hibert-encoder@in-domain-{a['chain_id']}"
    assert a["stages"]["finetune"]["reads"] == f"models:/hibert-encoder@in-domain-{a['chain_id']}"


def test_snapshots_carry_the_chain_aliases_and_recipe_edits_do_not_reach_queued_jobs(env, capsys):
    rec = recipe(env, f"sqlite:///{env / 'mlflow.db'}")
    jobs = submit(rec, "--out-dir", str(env / "o"))
    cid = jobs["chain_id"]
    assert jobs["jobs"] == {"pretrain-open": "101", "pretrain-in": "102", "finetune": "103", "evaluate": "104"}
    for stage in jobs["jobs"]:
        snap = env / "o" / cid / f"{stage}.yaml"
        assert jobs["stages"][stage]["snapshot"] == str(snap)
        assert stat.S_IMODE(snap.stat().st_mode) == 0o600  # like config.resolved.yaml: may hold credentials
        script = (env / "o" / f"{stage}.sbatch").read_text()
        sub = jobs["stages"][stage]["command"]
        assert f"hibert {sub} {snap} &" in script  # the job runs the snapshot and nothing else
    before = {s: (env / "o" / cid / f"{s}.yaml").read_text() for s in jobs["jobs"]}
    # writer and reader side of every hand-off
    cfg = {s: snapshot(jobs, s) for s in jobs["jobs"]}
    assert cfg["pretrain-open"].tracking.alias == f"open-domain-{cid}"
    assert cfg["pretrain-in"].run.init == f"models:/hibert-encoder@open-domain-{cid}"
    assert cfg["pretrain-in"].tracking.alias == f"in-domain-{cid}"
    assert cfg["finetune"].run.init == f"models:/hibert-encoder@in-domain-{cid}"
    assert cfg["finetune"].tracking.alias == f"finetuned-{cid}"
    assert cfg["evaluate"].tracking.alias is None and cfg["evaluate"].run.init is None

    # an edit of the recipe after submitting changes no snapshot a queued job will read
    edited = yaml.safe_load((env / "two.yaml").read_text())
    edited["model"] = {"name": "edited", "hidden": 32, "layers": 1, "heads": 2}
    (env / "two.yaml").write_text(yaml.safe_dump(edited))
    assert {s: (env / "o" / cid / f"{s}.yaml").read_text() for s in jobs["jobs"]} == before
    # a subset reading what a left-out stage registers: which chain's? refused, naming the chain to continue
    assert main(["submit", rec, "--out-dir", str(env / "o"), "--stages", "finetune"]) == 2
    assert f"(the latest chain in {env / 'o' / 'jobs.json'}: --chain {cid})" in capsys.readouterr().err
    # continuing the chain writes new snapshots next to the old ones, never over them
    more = submit(rec, "--out-dir", str(env / "o"), "--chain", cid, "--stages", "finetune", "--no-pin")
    assert more["chain_id"] == cid
    assert more["stages"]["finetune"]["snapshot"] == str(env / "o" / cid / "finetune.2.yaml")
    assert snapshot(more, "finetune").model.hidden == 32 and cfg["finetune"].model.hidden != 32
    assert {s: (env / "o" / cid / f"{s}.yaml").read_text() for s in jobs["jobs"]} == before


def test_an_init_from_outside_the_chain_is_pinned_at_submit_time(env, capsys):
    uri = f"sqlite:///{env / 'mlflow.db'}"
    earlier = load_config(recipe(env, uri, name="earlier"), ["run.stage=open-domain", "tracking.alias=open-domain"])
    v1 = publish(earlier, "user-open-v1", env)  # a user's @open-domain from before
    in_only = [PIPELINE[1], PIPELINE[2]]  # in-domain from @open-domain, which this chain does not write
    jobs = submit(recipe(env, uri, in_only), "--out-dir", str(env / "o"))
    cid = jobs["chain_id"]
    assert f"reads models:/hibert-encoder/{v1} (models:/hibert-encoder@open-domain pinned at submit time)" \
        in capsys.readouterr().out
    cfg = {s: snapshot(jobs, s) for s in jobs["jobs"]}
    assert cfg["pretrain-in"].run.init == f"models:/hibert-encoder/{v1}"
    assert cfg["finetune"].run.init == f"models:/hibert-encoder@in-domain-{cid}"  # the chain's own: an alias
    publish(earlier, "user-open-v2", env)  # @open-domain moves on while the chain waits in the queue
    assert start(cfg["pretrain-in"], env) == "user-open-v1"

    # continuing the chain: what its left-out stage registered is pinned too
    publish(cfg["pretrain-in"], "in-v3", env)
    more = submit(recipe(env, uri, in_only), "--out-dir", str(env / "o"), "--chain", cid, "--stages", "finetune")
    ft = snapshot(more, "finetune")
    assert ft.run.init.startswith("models:/hibert-encoder/") and start(ft, env) == "in-v3"

    # an alias that does not exist: refused now, not when the job starts
    bad = [{**PIPELINE[1], "overrides": ["run.stage=in-domain", "run.init=models:/hibert-encoder@nope"]}]
    assert main(["submit", recipe(env, uri, bad), "--out-dir", str(env / "x"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "stage pretrain-in: cannot pin models:/hibert-encoder@nope: not in the registry" in err and "--no-pin" in err


def test_an_unreachable_registry_is_refused_unless_no_pin(env, capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rec = recipe(env, f"http://127.0.0.1:{port}", [PIPELINE[1]])
    assert main(["submit", rec, "--out-dir", str(env / "o")]) == 2
    err = capsys.readouterr().err
    assert f"the registry http://127.0.0.1:{port} is not reachable" in err and "--no-pin" in err
    assert not (env / "o").exists()
    jobs = submit(rec, "--out-dir", str(env / "o"), "--no-pin")
    assert snapshot(jobs, "pretrain-in").run.init == "models:/hibert-encoder@open-domain"
    assert "not pinned (--no-pin)" in capsys.readouterr().out
    # a local store that does not exist is reported, not created
    missing = env / "none" / "mlflow.db"
    assert main(["submit", recipe(env, f"sqlite:///{missing}", [PIPELINE[1]]), "--dry-run"]) == 2
    assert "does not exist" in capsys.readouterr().err and not missing.parent.exists()


def test_chain_ids_and_aliases():
    from hibert.slurm.chain import ALIAS_RE, chain_alias, new_chain_id

    cid = new_chain_id("giga-cm.v2", now=0)
    assert cid.startswith("giga-cm-v2-19700101T000000Z-") and len(cid.rsplit("-", 1)[1]) == 4
    assert new_chain_id("x", now=0) != new_chain_id("x", now=0)
    assert new_chain_id("9lives", now=0).startswith("c9lives-")
    for alias in ("open-domain", "finetuned", "in_domain2"):
        assert ALIAS_RE.fullmatch(chain_alias(alias, cid))
    assert chain_alias("open-domain", "c.1") == "open-domain-c-1"


def test_what_a_stage_registers_matches_the_tasks():
    from hibert.slurm.chain import written_model

    cases = [("pretrain", ["run.stage=open-domain"]), ("pretrain", ["run.stage=in-domain", "tracking.alias=mine"]),
             ("pretrain", ["run.stage=none"]), ("pretrain", ["tracking.registered_model=enc", "run.stage=in-domain"]),
             ("finetune", []), ("finetune", ["run.stage=finetune", "tracking.alias=cnndm-ft"])]
    for command, overrides in cases:
        cfg = load_config(None, overrides)
        name, alias = registry_of(command, cfg)
        assert written_model(command, cfg) == ((name, alias) if alias else None), (command, overrides)
    if "finetune" in Config.model_fields:  # the finetune: section names the head
        cfg = load_config(None, ["finetune.task=abstractive"])  # another head, another registered model
        assert written_model("finetune", cfg) == registry_of("finetune", cfg) == ("hibert-abstractive", "finetuned")
    off = load_config(None, ["run.stage=open-domain", "tracking.register_model=false"])
    assert written_model("pretrain", off) is None
    assert written_model("evaluate", load_config(None, ["run.stage=finetune"])) is None


def test_stages_that_would_race_inside_one_chain_are_refused(env, capsys):
    uri = f"sqlite:///{env / 'mlflow.db'}"
    # a reader that does not wait for the stage that writes its alias
    no_wait = [PIPELINE[0], {"name": "other", "command": "pretrain", "after": []},
               {**PIPELINE[1], "after": ["other"]}]
    assert main(["submit", recipe(env, uri, no_wait), "--dry-run"]) == 2
    assert "stage pretrain-in reads models:/hibert-encoder@open-domain, which stage pretrain-open" in \
        capsys.readouterr().err
    # two stages of one chain registering the same alias
    twice = [PIPELINE[0], {**PIPELINE[0], "name": "again", "overrides": ["run.stage=open-domain", "run.name=b"]}]
    assert main(["submit", recipe(env, uri, twice), "--dry-run"]) == 2
    assert "stages pretrain-open and again both register hibert-encoder@open-domain" in capsys.readouterr().err


def test_local_demo_uses_a_chain_only_with_a_shared_store(env, monkeypatch):
    from hibert.slurm.local import chain_overrides
    from hibert.slurm.stages import find_recipe

    demo = find_recipe("demo")
    cfg = load_config(demo, [f"run.output_dir={env / 'demo'}"])
    root = env / "demo"
    (root / ".stages").mkdir(parents=True)
    own = chain_overrides(root, demo, cfg.slurm.pipeline, [f"run.output_dir={root}"], "demo")
    assert own == {}  # its own runs/demo/mlflow.db: plain aliases, argv (and so stage reuse) as before
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    shared = chain_overrides(root, demo, cfg.slurm.pipeline, [f"run.output_dir={root}"], "demo")
    cid = json.loads((root / ".stages" / "chain.json").read_text())["chain_id"]
    # the chain reads its own alias; the plain one is moved too, for people
    assert shared["pretrain-open"][0] == [f"tracking.alias=open-domain-{cid}", "tracking.also_aliases=[open-domain]",
                                       f"run.name=pretrain-open-{cid}"]
    assert shared["pretrain-in"][0] == [f"tracking.alias=in-domain-{cid}", "tracking.also_aliases=[in-domain]",
                                     f"run.init=models:/hibert-encoder@open-domain-{cid}", f"run.name=pretrain-in-{cid}"]
    assert shared["finetune"][0] == [f"tracking.alias=finetuned-{cid}", "tracking.also_aliases=[finetuned]",
                                  f"run.init=models:/hibert-encoder@in-domain-{cid}", f"run.name=finetune-{cid}"]
    assert shared["finetune-random"][0] == [f"run.name=finetune-random-{cid}"]  # registers nothing
    # a rerun keeps the chain id, so finished stages keep their argv and are reused
    assert chain_overrides(root, demo, cfg.slurm.pipeline, [f"run.output_dir={root}"], "demo") == shared
