"""The real staged pipeline through `hibert submit` on the local two-node Slurm cluster: prep job
arrays + merges -> open-domain pretraining (2 nodes, DeepSpeed over gloo) -> in-domain pretraining from
the registry alias -> finetune -> evaluate, chained with afterok, every stage the real `hibert` command."""
import json
from pathlib import Path

import pytest

from hibert.cli import main
from slurm_helpers import slurm_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STAGES = ["prep-open", "prep-open-merge", "prep-cnndm", "prep-cnndm-merge", "pretrain-open", "pretrain-in",
          "finetune", "evaluate"]


@pytest.mark.timeout(600)
def test_submit_runs_the_demo_chain_to_the_end(slurm_cluster, tmp_path):
    from hibert.registry import list_versions

    out_dir = tmp_path / "slurm"
    assert main(["submit", "demo", f"run.output_dir={tmp_path}", "schedule.max_steps=3", "schedule.eval_every=2",
                 "slurm.cpus_per_task=1", "slurm.nodes=2", "slurm.ntasks_per_node=1", "slurm.time=00:10:00",
                 "slurm.prep_shards=2",
                 "--stages", ",".join(STAGES), "--out-dir", str(out_dir)]) == 0
    chain = json.loads((out_dir / "jobs.json").read_text())
    ids, cid = chain["jobs"], chain["chain_id"]
    assert list(ids) == STAGES
    slurm_cluster.track(list(ids.values()))
    slurm_cluster.wait_done(ids["evaluate"], timeout=540)
    for stage, job in ids.items():
        assert set(slurm_cluster.states(job)) == {"COMPLETED"}, (stage, sorted(out_dir.glob(f"*{job}*")))
    assert "on n[1-2]" in next(out_dir.glob(f"*pretrain-open-{ids['pretrain-open']}.out")).read_text()
    aliases = {a for r in list_versions(f"sqlite:///{tmp_path / 'mlflow.db'}") for a in r["aliases"]}
    assert {f"open-domain-{cid}", f"in-domain-{cid}", f"finetuned-{cid}"} <= aliases
    report = json.loads((tmp_path / f"finetune-{cid}" / "report-test" / "report.json").read_text())
    # the extractive baselines: Lead-3, the oracle, the training oracle's positions (and Lead-k at a tuned k != 3)
    assert {"model", "lead3", "oracle", "position"} <= set(report["scores"]) <= {
        "model", "lead3", "oracle", "position", *(f"lead{k}" for k in range(1, 6))}

    # the prep array's two shards, one per node, + the merge == one local process preparing the same plan
    assert sorted(slurm_cluster.hosts(ids["prep-open"])) == ["n1", "n2"]
    local = tmp_path / "local-open"
    assert main(["prep", "demo", "data=sample_open", f"data.output={local}", "--num-shards", "2", "--no-progress"]) == 0
    assert dataset_files(tmp_path / "data" / "open") == dataset_files(local)


def dataset_files(root: Path) -> dict[str, bytes]:
    """Every file of a prepared dataset, bytes; the manifest without when and how long (`created`, the
    seconds), the shard markers (timings), the stat caches and the writers' locks (a Slurm array task holds one per
    shard, a local prep one for the whole output) left out."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_file() and p.name != ".verified.json" and not rel.startswith("shards/") and p.suffix != ".lock":
            out[rel] = p.read_bytes()
    manifest = json.loads(out.pop("manifest.json"))
    for key in ("created", "merge_seconds", "shard_seconds"):
        manifest.pop(key)
    out["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return out
