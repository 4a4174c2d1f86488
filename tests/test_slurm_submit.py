"""`hibert submit` against the real local cluster: the default chain (prep array -> merge -> pretrain
open/in-domain -> finetune -> evaluate) runs in dependency order, and a failing stage cancels the rest.
`slurm.cli` points the stages at a stand-in for the hibert command that records what it was asked."""
import json
import sys
import textwrap
import time

import pytest
import yaml

from hibert.cli import main
from hibert.config import load_config
from slurm_helpers import slurm_cluster  # noqa: F401  (fixture)

pytestmark = pytest.mark.slurm

FAKE_HIBERT = textwrap.dedent("""
    import json, os, sys, time
    start = time.time()
    name = os.environ["SLURM_JOB_NAME"]
    time.sleep(0.3)
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps({"job": name, "argv": sys.argv[1:], "start": start, "end": time.time(),
                            "task": os.environ.get("SLURM_ARRAY_TASK_ID"),
                            "rank": os.environ["SLURM_PROCID"]}) + "\\n")
    sys.exit(1 if name.endswith(os.environ.get("FAKE_FAIL", "<none>")) else 0)
""")


def recipe(tmp_path, fail: str = "<none>"):
    fake = tmp_path / "fake_hibert.py"
    fake.write_text(FAKE_HIBERT)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({
        "run": {"name": "tiny"},
        "slurm": {"nodes": 2, "gpus_per_node": 0, "ntasks_per_node": 1, "cpus_per_task": 1, "time": "00:05:00",
                  "prep_shards": 2, "cli": f"{sys.executable} {fake}",
                  "env": {"FAKE_LOG": str(tmp_path / "calls.jsonl"), "FAKE_FAIL": fail}},
    }))
    return path


def calls(tmp_path) -> list[dict]:
    log = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.timeout(100)
def test_submit_runs_the_default_chain_in_order(slurm_cluster, tmp_path, capsys):
    out_dir = tmp_path / "slurm"
    assert main(["submit", str(recipe(tmp_path)), "--out-dir", str(out_dir)]) == 0
    chain = json.loads((out_dir / "jobs.json").read_text())
    ids = chain["jobs"]
    slurm_cluster.track(list(ids.values()))
    printed = capsys.readouterr().out
    assert f"chain {chain['chain_id']}" in printed
    assert list(ids) == ["prep", "prep-merge", "pretrain-open", "pretrain-in", "finetune", "evaluate"]
    assert all(f"job {i}" in printed for i in ids.values())
    slurm_cluster.wait_done(ids["evaluate"], timeout=80)
    for stage, job in ids.items():
        assert set(slurm_cluster.states(job)) == {"COMPLETED"}, stage
    runs = calls(tmp_path)
    by_job: dict[str, list[dict]] = {}
    for c in runs:
        by_job.setdefault(c["job"].removeprefix("tiny-"), []).append(c)
    assert sorted(c["task"] for c in by_job["prep"]) == ["0", "1"]       # one array task per shard
    assert {tuple(c["argv"][-4:]) for c in by_job["prep"]} == {("--num-shards", "2", "--shard-index", t)
                                                                for t in ("0", "1")}
    assert by_job["prep-merge"][0]["argv"][-3:] == ["--merge", "--num-shards", "2"]
    assert sorted(c["rank"] for c in by_job["pretrain-open"]) == ["0", "1"]  # nodes=2: one task per node
    # every stage ran its snapshot; the in-domain one starts from this chain's open-domain encoder
    argv = by_job["pretrain-in"][0]["argv"]
    assert argv == ["pretrain", chain["stages"]["pretrain-in"]["snapshot"]]
    assert load_config(argv[1]).run.init == f"models:/hibert-encoder@open-domain-{chain['chain_id']}"
    assert load_config(by_job["pretrain-open"][0]["argv"][1]).tracking.alias == f"open-domain-{chain['chain_id']}"
    order = list(ids)
    for before, after in zip(order, order[1:]):  # afterok: a stage starts after its predecessor ended
        assert min(c["start"] for c in by_job[after]) >= max(c["end"] for c in by_job[before]), (before, after)


@pytest.mark.timeout(60)
def test_failed_stage_cancels_the_rest_of_the_chain(slurm_cluster, tmp_path):
    out_dir = tmp_path / "slurm"
    rc = main(["submit", str(recipe(tmp_path, fail="pretrain-open")), "--out-dir", str(out_dir),
               "--stages", "pretrain-open,pretrain-in,finetune"])
    assert rc == 0
    ids = json.loads((out_dir / "jobs.json").read_text())["jobs"]
    slurm_cluster.track(list(ids.values()))
    assert slurm_cluster.wait_done(ids["pretrain-open"], timeout=40)["JobState"] == "FAILED"
    for stage in ("pretrain-in", "finetune"):  # --kill-on-invalid-dep: cancelled, not pending forever
        assert slurm_cluster.wait_done(ids[stage], timeout=20)["JobState"] == "CANCELLED", stage
    time.sleep(0.5)
    assert {c["job"] for c in calls(tmp_path)} == {"tiny-pretrain-open"}
