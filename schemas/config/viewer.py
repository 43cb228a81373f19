"""``[viewer]``: the read-only trajectory viewer over the lake, started by `agentlake up` and `agentlake ui`.

It binds loopback by default; a host other than loopback needs tokens (``collector.auth_tokens``), as the
gateway's anonymous calls do. ``public_url`` is the address links point to (Dagster metadata, `agentlake
model show`); empty: the running stack's viewer (its stack file), else ``http://host:port``.
"""

from __future__ import annotations

from pydantic import Field

from schemas.config.base import Section


class ViewerSettings(Section):
    enabled: bool = True  # `agentlake up` starts it (a managed process named `viewer`)
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)  # 0: a free one
    public_url: str = ""  # where links point (https://viewer.example.com); empty: http://host:port

    @property
    def url(self) -> str:
        """Where people and links reach the viewer: ``public_url`` when set, else its own address."""
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    def link(self, path: str) -> str:
        """The viewer's URL of ``path`` (``/rollouts/r-1``), for links from other tools."""
        return f"{self.url}/{path.lstrip('/')}"
