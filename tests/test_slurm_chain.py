"""The real staged pipeline through `hibert submit` on the local two-node Slurm cluster: prep job
arrays + merges -> open-domain pretraining (2 nodes, DeepSpeed over gloo) -> in-domain pretraining from
the registry alias -> finetune -> evaluate, chained with afterok, every stage the real `hibert` command."""
import json

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
    assert set(report["scores"]) == {"model", "lead3", "oracle"}
