"""How every other tool finds the running local stack: `agentlake up` records it, settings loading reads it.

`up` writes the live addresses (broker, lake, collector, gateway, vLLM, Dagster, the viewer) and the pid and start
time of each process to ``<state>/stack.json`` (``write_stack_file``); `down` removes it. The reader sits
below agentlake, in ``schemas.config.stack_file``, with the liveness check in ``schemas.processes``: every
tool that loads settings (the collector, ``dagster asset materialize``, the trainer) reads the file
without importing agentlake, takes from it what nothing explicit sets, and ignores a file whose
processes are gone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from agentlake.stack import processes
from schemas.config import Settings
from schemas.config.stack_file import STACK_FILE_VERSION, stack_file
from schemas.uris import normalize_uri


def write_stack_file(sdir: Path, settings: Settings, bootstrap: str) -> Path:
    """Record the live addresses and processes of the stack under ``sdir`` for every other tool; return the file."""
    procs: dict[str, dict[str, Any]] = {}
    for proc in processes.list_managed(sdir):
        if proc.is_running():
            procs[proc.name] = {"pid": proc.pid, "create_time": proc.create_time, "address": proc.address}
    c, g, v, d = settings.collector, settings.gateway, settings.vllm, settings.dagster
    vllm_port = v.port
    if "vllm" in procs:  # port 0 in the settings: the one it was started on
        try:
            vllm_port = int(procs["vllm"]["address"].rsplit(":", 1)[1].split("/")[0])
        except (IndexError, ValueError):
            pass
    lake_root = normalize_uri(settings.lake.root)  # one spelling per lake, as every table location
    lake: dict[str, object] = {"root": lake_root}
    if settings.lake.is_local:  # the local store's fixed keys; a user's own credentials are never written here
        lake["storage_options"] = dict(settings.lake.storage_options)
    doc = {
        "version": STACK_FILE_VERSION,
        "written_at": time.time(),
        "processes": procs,
        "settings": {
            "kafka": {"bootstrap_servers": bootstrap},
            "lake": lake,
            "collector": {"host": c.host, "http_port": c.http_port, "grpc_port": c.grpc_port},
            "gateway": {"host": g.host, "port": g.port},
            "vllm": {"host": v.host, "port": vllm_port},
            "dagster": {
                "home": str(settings.dagster.home.resolve()),
                "host": d.host,
                "port": d.port,
                "profile": d.profile,
            },
        },
    }
    if "mlflow" in procs:  # the stack's MLflow server (agentlake.stack.mlflow_server): the trainer's tracking.uri
        doc["settings"]["tracking"] = {"uri": procs["mlflow"]["address"]}  # type: ignore[index]
    if "viewer" in procs:  # the stack's viewer (agentlake.stack.viewer): where links to its pages point
        host, _, port = procs["viewer"]["address"].removeprefix("http://").rpartition(":")
        doc["settings"]["viewer"] = {"host": host, "port": int(port)}  # type: ignore[index]
    path = stack_file(sdir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    os.replace(tmp, path)
    return path
