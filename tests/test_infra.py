"""infra/: docker-compose.yml validated by `docker-compose config` (Docker itself cannot run
here; CI installs Debian's docker-compose), the docs' connection settings checked against it,
prefect.yaml's entrypoints resolved to flows, and the worker Dockerfile's inputs present."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"


def _compose(*args: str, env_file: Path = INFRA / ".env.example") -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is not installed (CI: apt-get install -y docker-compose); "
                    "it validates infra/docker-compose.yml")
    return subprocess.run(
        [exe, "--env-file", str(env_file), "-f", str(INFRA / "docker-compose.yml"), *args],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )


@pytest.fixture(scope="module")
def compose() -> dict:
    """The resolved compose configuration (``docker-compose config`` with .env.example)."""
    proc = _compose("config", "-q")
    assert proc.returncode == 0, proc.stderr
    proc = _compose("config")
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def _published(service: dict, target: int) -> int:
    for port in service["ports"]:
        if isinstance(port, dict) and int(port["target"]) == target:
            return int(port["published"])
        if isinstance(port, str) and port.endswith(f":{target}"):
            return int(port.split(":")[-2])
    raise AssertionError(f"port {target} not published: {service['ports']}")


@pytest.mark.integration
def test_compose_file_is_valid_and_complete(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "mongo", "minio", "minio-init", "prefect-db",
                             "prefect-server"}
    for name in ("postgres", "mongo", "minio", "prefect-db"):
        assert "healthcheck" in services[name], name
    assert services["prefect-server"]["depends_on"]["prefect-db"]["condition"] == "service_healthy"
    assert services["minio-init"]["depends_on"]["minio"]["condition"] == "service_healthy"
    db_url = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert db_url == "postgresql+asyncpg://prefect:change-me-prefect@prefect-db:5432/prefect"
    assert set(compose["volumes"]) == {"postgres-data", "mongo-data", "minio-data",
                                       "prefect-db-data"}


@pytest.mark.integration
def test_compose_refuses_to_start_without_passwords(tmp_path):
    env = tmp_path / "empty.env"
    env.write_text("POSTGRES_USER=querylab\n")
    proc = _compose("config", "-q", env_file=env)
    assert proc.returncode != 0
    assert "PASSWORD in infra/.env" in proc.stderr


def _documented_env() -> dict[str, str]:
    text = (REPO / "docs" / "operations.md").read_text()
    block = text.split("<!-- compose-env", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return dict(re.findall(r"^export (\w+)=(\S+)$", block, re.MULTILINE))


@pytest.mark.integration
def test_documented_settings_point_at_the_compose_services(compose):
    env = _documented_env()
    services = compose["services"]
    pg = urlparse(env["QUERYLAB_POSTGRES_URL"])
    pg_env = services["postgres"]["environment"]
    assert (pg.scheme, pg.username, pg.password, pg.port, pg.path.strip("/")) == (
        "postgresql", pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"],
        _published(services["postgres"], 5432), pg_env["POSTGRES_DB"])
    mongo = urlparse(env["QUERYLAB_MONGO_URI"])
    mongo_env = services["mongo"]["environment"]
    assert (mongo.username, mongo.password, mongo.port) == (
        mongo_env["MONGO_INITDB_ROOT_USERNAME"], mongo_env["MONGO_INITDB_ROOT_PASSWORD"],
        _published(services["mongo"], 27017))
    minio_env = services["minio"]["environment"]
    assert env["AWS_ACCESS_KEY_ID"] == minio_env["MINIO_ROOT_USER"]
    assert env["AWS_SECRET_ACCESS_KEY"] == minio_env["MINIO_ROOT_PASSWORD"]
    assert urlparse(env["AWS_ENDPOINT_URL"]).port == _published(services["minio"], 9000)
    bucket = services["minio-init"]["environment"]["ARTIFACT_BUCKET"]
    assert env["QUERYLAB_ARTIFACTS"].startswith(f"s3://{bucket}/")
    api = urlparse(env["PREFECT_API_URL"])
    assert api.port == _published(services["prefect-server"], 4200) and api.path == "/api"


def test_documented_settings_are_the_ones_querylab_reads(monkeypatch):
    from schemas.settings import Settings

    env = _documented_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s = Settings.from_env()
    assert (s.postgres_url, s.mongo_uri, s.artifacts) == (
        env["QUERYLAB_POSTGRES_URL"], env["QUERYLAB_MONGO_URI"], env["QUERYLAB_ARTIFACTS"])


def test_prefect_yaml_entrypoints_are_flows_and_cover_every_stage():
    from prefect import Flow

    from flows.stages import STAGE_FLOWS

    spec = yaml.safe_load((INFRA / "prefect.yaml").read_text())
    names = [d["name"] for d in spec["deployments"]]
    assert len(names) == len(set(names))
    assert set(STAGE_FLOWS) | {"benchmark", "rerun-errored"} == set(names)
    for d in spec["deployments"]:
        path, _, attr = d["entrypoint"].partition(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, attr)
        assert isinstance(flow, Flow), d["entrypoint"]
        assert "run_id" in flow.parameters.properties, d["entrypoint"]
        if d["name"] in STAGE_FLOWS:
            assert flow is STAGE_FLOWS[d["name"]]
        if d["name"] != "benchmark":
            assert flow.parameters.required == ["run_id"]
        for key in d.get("parameters") or {}:
            assert key in flow.parameters.properties, (d["name"], key)
    cron = [s for d in spec["deployments"] for s in d.get("schedules") or []]
    assert cron and all(s["timezone"] and len(s["cron"].split()) == 5 for s in cron)


def test_worker_dockerfile_inputs_exist_and_match_the_pool():
    lines = [line.strip() for line in (INFRA / "Dockerfile").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0].startswith("FROM python:3.1")
    for line in lines:
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), src
    assert any(re.match(r"^RUN pip install -e \.", line) for line in lines)
    assert any(line.startswith("USER ") and "root" not in line for line in lines)
    cmd = next(line for line in lines if line.startswith("CMD "))
    pool = yaml.safe_load((INFRA / "prefect.yaml").read_text())["definitions"]["work_pool"]["name"]
    assert f'"--pool", "{pool}"' in cmd
