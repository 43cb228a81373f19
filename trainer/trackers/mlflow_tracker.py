"""An MLflow run per training round, through ``MlflowClient`` (no global active run, so rounds in one
process never share a run).

Why a probe first: MLflow's HTTP client retries an unreachable server with backoff for minutes; the
tracker asks ``<uri>/health`` once (a few seconds at most) and raises, so ``SafeTracker`` warns and the
round goes on. Retries and timeouts of the client itself are capped the same way unless set already.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import httpx

# MLflow reads these per request; the defaults (7 retries, 120 s) would hold a round up for minutes.
_CLIENT_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_DISABLE_TELEMETRY": "true",  # an offline machine would wait on its upload at exit
}
TAG_KEYS = ("version", "parent_version", "line", "base_model", "algorithm")
MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter's value


def server_answers(uri: str, *, timeout_s: float = 3.0) -> bool:
    """True when an MLflow tracking server answers ``/health`` at ``uri`` (http/https only)."""
    try:
        return httpx.get(uri.rstrip("/") + "/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def param_value(value: Any) -> str:
    """A parameter as MLflow stores it: text, JSON for lists and tables, cut to MLflow's limit."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:MAX_PARAM_CHARS]


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page in MLflow's UI."""
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


class MlflowTracker:
    """One MLflow run: parameters (each key once; a few are also tags), step metrics, finished on close."""

    def __init__(self, *, uri: str, experiment: str = "agentlake", run_name: str | None = None) -> None:
        if uri.startswith(("http://", "https://")) and not server_answers(uri):
            raise ConnectionError(f"no MLflow tracking server answers at {uri}")
        for key, value in _CLIENT_LIMITS.items():
            os.environ.setdefault(key, value)
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={"agentlake.round": "1"})
        self.run_id: str = run.info.run_id
        self.url = run_url(uri, self.experiment_id, self.run_id)
        self._logged: set[str] = set()

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param, RunTag

        new = {k: v for k, v in params.items() if k not in self._logged}
        # None reads "none" (a parent_version of None: trained from the base model)
        tags = [RunTag(k, "none" if v is None else param_value(v)) for k, v in params.items() if k in TAG_KEYS]
        if "version" in params and params["version"]:
            tags.append(RunTag("mlflow.runName", str(params["version"])))  # the run reads as its version
        self.client.log_batch(self.run_id, params=[Param(k, param_value(v)) for k, v in new.items()], tags=tags)
        self._logged.update(new)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


def log_to_run(uri: str, run_id: str, metrics: Mapping[str, float], *, step: int = 0) -> None:
    """Add metrics to a finished run (the eval gate's scores come after the round closed its run)."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    for key, value in _CLIENT_LIMITS.items():
        os.environ.setdefault(key, value)
    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
    MlflowClient(tracking_uri=uri).log_batch(run_id, metrics=batch)
