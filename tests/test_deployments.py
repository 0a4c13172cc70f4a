"""infra/prefect.yaml deploys with `prefect deploy --all` against the test's Prefect server
(offline), and a stage deployment run started through the Prefect API is picked up by a process
worker (`prefect worker start --run-once`) and completes — here the report stage of a run whose
artifacts are in S3 (moto), in a worker with no local state and no AWS keys of its own: the keys
come from Prefect Secret blocks through the work pool's base job template (docs/operations.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tasks.core import runs
from tasks.core import storage
from tests.fakes.s3 import moto_s3

REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect"))
POOL = "querylab"
BUCKET = "querylab-deploy"


def _prefect(args: list[str], env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    proc = subprocess.run([PREFECT, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, (args, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def test_prefect_yaml_deploys_and_a_stage_deployment_run_completes(prefect_harness, tmp_path):
    from prefect.blocks.system import Secret
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL
    from prefect.workers.process import ProcessWorker

    from flows.benchmark import benchmark
    from flows.stages import STAGE_FLOWS

    spec = yaml.safe_load((REPO / "infra" / "prefect.yaml").read_text())
    assert {d["work_pool"]["name"] for d in spec["deployments"]} == {POOL}
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_CLI_PROMPT": "false"}
    # the pool's flow runs get AWS keys from Secret blocks, resolved by the worker per run
    template = ProcessWorker.get_default_base_job_template()
    template["variables"]["properties"]["env"]["default"] = {
        "AWS_ACCESS_KEY_ID": "{{ prefect.blocks.secret.querylab-aws-access-key-id }}",
        "AWS_SECRET_ACCESS_KEY": "{{ prefect.blocks.secret.querylab-aws-secret-access-key }}",
        # not a secret, but proof that the worker resolved the blocks: the run needs it
        "QUERYLAB_ARTIFACTS": "{{ prefect.blocks.secret.querylab-test-artifacts }}",
    }
    template_file = tmp_path / "process-template.json"
    template_file.write_text(json.dumps(template))
    _prefect(["work-pool", "create", POOL, "--type", "process", "--overwrite",
              "--base-job-template", str(template_file)], env)
    out = _prefect(["--no-prompt", "deploy", "--all", "--prefect-file", "infra/prefect.yaml"], env)
    assert "stage-trials/trials" in out.stdout

    with get_client(sync_client=True) as client:
        deployments = {f"{client.read_flow(d.flow_id).name}/{d.name}": d
                       for d in client.read_deployments()}
    expected = {"benchmark/benchmark", "rerun-errored/rerun-errored"} | {
        f"stage-{s}/{s}" for s in STAGE_FLOWS}
    assert expected <= set(deployments)
    nightly = deployments["benchmark/benchmark"]
    assert [(s.schedule.cron, s.active) for s in nightly.schedules] == [("0 2 * * *", True)]
    assert nightly.parameters == {"agents": ["oracle"], "n_trials": 5, "batch_size": 25,
                                  "max_concurrency": 32}
    assert nightly.work_pool_name == POOL
    for stage in STAGE_FLOWS:
        d = deployments[f"stage-{stage}/{stage}"]
        assert d.entrypoint == f"flows/stages.py:stage_{stage}"
        assert d.parameter_openapi_schema["required"] == ["run_id"]
        assert d.pull_steps == [{"prefect.deployments.steps.set_working_directory":
                                 {"directory": str(REPO)}}]

    root = f"s3://{BUCKET}/deployed"
    with moto_s3(BUCKET) as aws:
        Secret(value=aws["AWS_ACCESS_KEY_ID"]).save("querylab-aws-access-key-id", overwrite=True)
        Secret(value=aws["AWS_SECRET_ACCESS_KEY"]).save("querylab-aws-secret-access-key",
                                                         overwrite=True)
        Secret(value=root).save("querylab-test-artifacts", overwrite=True)
        benchmark(run_id="dep-run", datasets=["stocks"], n_trials=1, artifacts_root=root)
        assert runs.stage_status(root, "dep-run", "report").attempt == 1
        flow_run = run_deployment("stage-report/report", parameters={"run_id": "dep-run"},
                                  timeout=0)
        fresh = tmp_path / "worker"
        fresh.mkdir()
        worker_env = {k: v for k, v in env.items() if not k.startswith(("QUERYLAB_", "AWS_"))}
        worker_env.update(
            AWS_ENDPOINT_URL=aws["AWS_ENDPOINT_URL"], AWS_DEFAULT_REGION="us-east-1",
            AWS_SHARED_CREDENTIALS_FILE=str(fresh / "none"), AWS_CONFIG_FILE=str(fresh / "none"),
            AWS_EC2_METADATA_DISABLED="true",  # no credentials but the blocks'
            QUERYLAB_HOME=str(fresh / "home"), PYTHONPATH=str(REPO),
        )
        _prefect(["worker", "start", "--pool", POOL, "--run-once"], worker_env, timeout=240)
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run.id).state
        assert state.is_completed(), state
        assert "QUERYLAB_ARTIFACTS" not in worker_env and "AWS_ACCESS_KEY_ID" not in worker_env
        status = runs.stage_status(root, "dep-run", "report")
        assert status.status == "completed" and status.attempt == 2
        assert status.flow_run_id == str(flow_run.id)  # the deployment's run did it
        assert storage.exists(status.outputs["markdown"])
        assert status.outputs["markdown"].startswith(root)
        with get_client(sync_client=True) as client:  # the keys are in no deployment
            for d in client.read_deployments():
                assert aws["AWS_SECRET_ACCESS_KEY"] not in json.dumps(d.model_dump(mode="json"))
    assert not list(fresh.rglob("*.parquet"))
