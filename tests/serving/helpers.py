"""Serving's test helpers: a stand-in vLLM for publishing, and storing a version folder in a registry.

No torch here: serving runs without it, and so do the tests that need only these.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class FakeVllm(ThreadingHTTPServer):
    """Records every POST body; answers ``load_status`` to adapter loads."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.load_status = 200
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def loads(self) -> list[str]:
        return [b["lora_path"] for p, b in self.requests if p == "/v1/load_lora_adapter"]


class _Handler(BaseHTTPRequestHandler):
    server: FakeVllm

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/v1/models":
            self._send(200, {"data": [{"id": "base-model", "parent": None}]})
        else:
            self._send(200, {})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        self.server.requests.append((self.path, body))
        if self.path == "/v1/load_lora_adapter":
            status = self.server.load_status
            self._send(status, {"message": "boom: adapter rejected"} if status >= 400 else {})
        else:
            self._send(200, {})

    def log_message(self, *args: object) -> None:
        pass


def register_stored(reg: Any, folder: Path, number: int, *, kind: str = "lora", base_model: str = "base") -> str:
    """Store ``folder`` as version ``v000<number>`` in the registry's own lake (files + manifest), register it."""
    from trainer.artifacts import store_version

    version = f"v{number:04d}"
    lake = reg.lake
    stored = store_version(folder, lake_root=lake.root, version=version, storage_options=lake.storage_options)
    reg.add(
        version=version,
        version_number=number,
        base_model=base_model,
        kind=kind,
        path=str(folder),
        artifact_uri=stored.uri,
        manifest_sha256=stored.manifest_sha256,
    )
    return version


@contextmanager
def running_fake_vllm() -> Iterator[FakeVllm]:
    """A ``FakeVllm`` answering on a thread until the block ends."""
    server = FakeVllm()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
