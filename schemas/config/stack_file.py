"""The running local stack's file, ``<state dir>/stack.json``: its format and its reader.

``agentlake up`` (agentlake.stack.discovery) writes the addresses it started with (broker, lake, collector,
gateway, vLLM, Dagster) and the pid and start time of each process; `agentlake down` removes it.
Settings loading reads it here, below ``agentlake``, so every tool finds the live stack by itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from schemas.processes import process_alive

STACK_FILE = "stack.json"  # under the state dir, written by `agentlake up`, removed by `agentlake down`
STACK_FILE_VERSION = 1
# Settings a stack file may supply: addresses and paths, and the local object store's storage options
# (its fixed local keys; a user's own credentials stay in their settings and are never recorded).
STACK_KEYS: dict[str, tuple[str, ...]] = {
    "kafka": ("bootstrap_servers",),
    "lake": ("root", "storage_options"),
    "collector": ("host", "http_port", "grpc_port"),
    "gateway": ("host", "port"),
    "vllm": ("host", "port"),
    "dagster": ("home", "host", "port", "profile"),
    "tracking": ("uri",),  # the stack's MLflow server, when it runs one
    "viewer": ("host", "port"),  # the stack's viewer, when it runs one
}


def stack_file(state_dir: str | os.PathLike[str]) -> Path:
    """The running stack's file under ``state_dir``."""
    return Path(state_dir) / STACK_FILE


def live_stack(state_dir: str | os.PathLike[str]) -> tuple[dict[str, dict[str, Any]], bool]:
    """(settings, whether its Kafka is the stack's own broker) of the live stack under ``state_dir``.

    The stack runs while any process it recorded runs; its Kafka address counts only while its
    broker runs (or, for an external Kafka, while the stack does).
    """
    try:
        doc = json.loads(stack_file(state_dir).read_text())
    except (OSError, ValueError):
        return {}, False
    if not isinstance(doc, dict) or doc.get("version") != STACK_FILE_VERSION:
        return {}, False
    procs = doc.get("processes")
    recorded = doc.get("settings")
    if not isinstance(procs, dict) or not isinstance(recorded, dict):
        return {}, False
    alive = {
        name for name, p in procs.items() if isinstance(p, dict) and process_alive(p.get("pid"), p.get("create_time"))
    }
    if not alive:
        return {}, False
    out: dict[str, dict[str, Any]] = {}
    for section, keys in STACK_KEYS.items():
        values = recorded.get(section)
        if not isinstance(values, dict):
            continue
        picked = {k: values[k] for k in keys if k in values and values[k] not in (None, "")}
        if section == "kafka" and "broker" in procs and "broker" not in alive:
            picked = {}
        if picked:
            out[section] = picked
    return out, "broker" in alive
