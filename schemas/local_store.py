"""The local object store's layout, as every tool that finds it needs it (settings, the stack, tests).

`agentlake up` runs SeaweedFS (``agentlake.stack.objectstore``) and records its ports in
``<state>/objectstore.ports``; settings resolution reads them to find the default lake
(``s3://agentlake-lake``) while the stack is down. Plain data and stdlib only, so ``schemas`` stays
importable without the stack.
"""

from __future__ import annotations

import json
from pathlib import Path

PORTS_FILE = "objectstore.ports"
LAKE_BUCKET = "agentlake-lake"  # the default lake: s3://agentlake-lake/ on the same store
LAKE_ROOT = f"s3://{LAKE_BUCKET}"
# The store's one identity (its S3 config file): every client (Tansu, delta-rs, DuckDB, pyarrow) signs with it.
ACCESS_KEY = "agentlake"
SECRET_KEY = "agentlake"
REGION = "us-east-1"


def read_ports(path: Path) -> dict[str, int] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def lake_storage_options(endpoint: str) -> dict[str, str]:
    """delta-rs storage options (the lake's ``lake.storage_options``) for a bucket of this store.

    ``AWS_CONDITIONAL_PUT=etag`` spells out what makes concurrent writers safe: delta-rs 1.x commits
    ``_delta_log/<version>.json`` as a create-only put (``If-None-Match: *``), so of two writers racing
    for one version exactly one wins and the other retries on top of it. SeaweedFS answers the loser
    412 (checked in tests/lake/test_concurrent_writers.py); ``disabled`` would make every commit fail,
    and ``AWS_S3_ALLOW_UNSAFE_RENAME`` no longer changes how delta-rs 1.x commits.
    """
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",
        "AWS_CONDITIONAL_PUT": "etag",
    }


def endpoint_of(ports: dict[str, int]) -> str:
    """The S3 endpoint of a store with these ports (it listens on 127.0.0.1)."""
    return f"http://127.0.0.1:{ports['s3']}"


def listening(endpoint: str, *, timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections at ``endpoint`` (cheap: a refused port answers at once)."""
    import socket

    hostport = endpoint.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False
