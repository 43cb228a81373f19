"""deploy/: what runs here runs (the instance file on a real PostgreSQL), what cannot is linted.

No Kubernetes, Helm or Docker on this machine: the Helm values and the Dockerfile are checked against
what they name (the code module, the files they copy, the port the workspace expects) and the GPU pod
config against Kubernetes' own models, through dagster-k8s.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance

from agentlake.stack import dagster, postgres
from pipelines.defs.assets.policy import GPU_TAGS, policy
from pipelines.defs.automation import policy_job

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def test_every_yaml_in_deploy_parses() -> None:
    found = sorted(DEPLOY.rglob("*.y*ml"))
    assert {p.relative_to(DEPLOY).as_posix() for p in found} >= {"dagster.yaml", "workspace.yaml", "helm/values.yaml"}
    for path in found:
        assert isinstance(yaml.safe_load(path.read_text()), dict), path


@pytest.mark.slow  # starts PostgreSQL: ~6 s
@pytest.mark.skipif(postgres.bin_dir() is None, reason="PostgreSQL is not installed (apt-get install postgresql)")
def test_deploy_dagster_yaml_runs_on_postgres(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The instance a deployment gets: validated by Dagster's schema, opened and queried on a real PostgreSQL."""
    state = tmp_path / "state"
    state.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(DEPLOY / "dagster.yaml", home / "dagster.yaml")  # its storage folders go here, not in deploy/
    try:
        conn = postgres.start(state)
        for key, value in conn.env().items():
            monkeypatch.setenv(key, value)
        with DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
            assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
            assert type(instance.run_launcher).__name__ == "DefaultRunLauncher"
            limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
            assert {"key": "agentlake/gpu", "limit": 1} in limits
            assert instance.get_runs() == []  # the tables exist and answer
    finally:
        postgres.stop(state)


def test_dagster_yaml_rejects_a_typo(tmp_path: Path) -> None:
    """The schema check above is real: a misspelt key fails Dagster's validation."""
    from dagster._core.instance.config import dagster_instance_config

    config = load("dagster.yaml")
    config["storage"]["postgres"]["postgres_db"]["hostnme"] = config["storage"]["postgres"]["postgres_db"].pop(
        "hostname"
    )
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(Exception, match="hostnme"):
        dagster_instance_config(str(tmp_path))


def test_workspace_names_the_code_server_the_dockerfile_runs() -> None:
    [entry] = load("workspace.yaml")["load_from"]
    server = entry["grpc_server"]
    assert server["location_name"] == dagster.LOCATION_NAME
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    assert cmd[:3] == ["dagster", "api", "grpc"]
    assert cmd[cmd.index("-m") + 1] == dagster.CODE_MODULE
    assert int(cmd[cmd.index("-p") + 1]) == server["port"]
    assert cmd[cmd.index("--location-name") + 1] == dagster.LOCATION_NAME


def test_dockerfile_copies_what_exists() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    sources = [
        src
        for line in dockerfile.splitlines()
        if line.startswith("COPY ")
        for src in line.split()[1:-1]
        if not src.startswith("--")
    ]
    assert "pipelines" in sources and "deploy/dagster.yaml" in sources
    for src in sources:
        assert (REPO / src).exists(), f"deploy/Dockerfile copies {src}, which is not in the repository"
    # every first-party package the wheel installs is copied
    for package in ("agentlake", "schemas", "collectors", "pipelines", "trainer"):
        assert package in sources, package


def test_helm_values_deploy_this_code_location() -> None:
    values = load("helm/values.yaml")
    [deployment] = values["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    module = args[args.index("--module-name") + 1]
    assert module == dagster.CODE_MODULE and importlib.util.find_spec(module) is not None
    assert deployment["name"] == dagster.LOCATION_NAME
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    limits = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["tagConcurrencyLimits"]
    assert {"key": "agentlake/gpu", "limit": 1} in limits
    assert values["postgresql"]["postgresqlScheme"] == dagster.SQLALCHEMY_SCHEME
    # the pools the ingestion assets take are those of the local instance
    local = yaml.safe_load((REPO / "dagster_home/dagster.yaml").read_text())["concurrency"]["pools"]
    pools = values["concurrency"]["pools"]
    assert (pools["defaultLimit"], pools["granularity"]) == (local["default_limit"], local["granularity"])


def test_policy_runs_get_a_gpu_pod() -> None:
    """The tag the K8sRunLauncher reads, built into a Kubernetes Job exactly as dagster-k8s builds it."""
    from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config

    assert policy.op.tags["agentlake/gpu"] == "1"
    assert policy_job.tags["dagster-k8s/config"] == policy.op.tags["dagster-k8s/config"]
    job_config = DagsterK8sJobConfig(job_image="agentlake-code:gpu", dagster_home="/opt/dagster/dagster_home")
    run_config = load("helm/values.yaml")["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"]
    for tags in (policy.op.tags, policy_job.tags):
        job = construct_dagster_k8s_job(job_config, ["dagster"], "dagster-run-1", get_user_defined_k8s_config(tags))
        pod = job.spec.template.spec
        assert pod.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
        assert pod.node_selector == {"nvidia.com/gpu.present": "true"}
        assert [t.key for t in pod.tolerations] == ["nvidia.com/gpu"]
    # the Helm values' run pod config uses fields Kubernetes knows (camelCase, as the chart passes them)
    from dagster_k8s.job import UserDefinedDagsterK8sConfig

    defaults = UserDefinedDagsterK8sConfig.from_dict(
        {"container_config": run_config["containerConfig"], "pod_spec_config": run_config["podSpecConfig"]}
    )
    job = construct_dagster_k8s_job(job_config, ["dagster"], "dagster-run-2", defaults)
    assert job.spec.template.spec.containers[0].resources.requests == {"cpu": "1", "memory": "4Gi"}
    assert GPU_TAGS["dagster-k8s/config"]["container_config"]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_a_misspelt_pod_field_is_caught() -> None:
    """The check above can fail: dagster-k8s refuses fields that Kubernetes' PodSpec does not have."""
    from dagster_k8s.job import get_user_defined_k8s_config

    with pytest.raises(Exception, match="node_selektor"):
        get_user_defined_k8s_config({"dagster-k8s/config": json.dumps({"pod_spec_config": {"node_selektor": {}}})})
