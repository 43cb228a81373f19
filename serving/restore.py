"""Serving follows the registry: what each policy line should serve, and whether a vLLM serves it.

The registry (``model_versions``) says which version of each policy line is published; vLLM keeps loaded
adapters only in memory, so a vLLM that restarted (``agentlake down``/``up --vllm``, a crash) serves the base
model alone while the registry still says v0005. A loader (serving.loader) restores the lines' versions from
here, and `agentlake status` compares what vLLM lists with the registry (``compare``) for one vLLM too, where
no release bus records acks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.config.serving import policy_served_name
from schemas.manifest import ManifestHashes
from serving.releases import release_command
from serving.vllm_client import VllmClient


def serving_rows(rows: Iterable[dict[str, Any]], served_name: str) -> dict[str, dict[str, Any]]:
    """Served name -> its line's serving version (the latest published row per line, as
    ``Registry.serving``), full-weight lines first: restarting vLLM on full weights drops every adapter."""
    live: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["publish_status"] != "published" or r["published_at"] is None:
            continue
        name = policy_served_name(served_name, r.get("agent"))
        if name not in live or r["published_at"] > live[name]["published_at"]:
            live[name] = r
    return dict(sorted(live.items(), key=lambda kv: (kv[1]["kind"] != "full", kv[0])))


def restore_commands(rows: Iterable[dict[str, Any]], served_name: str) -> list[dict[str, Any]]:
    """A ``release`` command per line for its serving version: what a loader applies to a vLLM lacking it."""
    return [release_command(row, served_name=name) for name, row in serving_rows(rows, served_name).items()]


def lacks(client: VllmClient, command: dict[str, Any]) -> bool:
    """Whether ``client``'s vLLM lacks what ``command`` serves: no adapter under its name (any folder: a
    publish in progress is not undone here), or for full weights a base model from another version's folder."""
    if command.get("kind") == "full":
        base = client.base_model()
        return base is None or Path(base[1]).name != command["version"]
    return client.adapter_root(str(command["served_name"])) is None


@dataclass(frozen=True)
class LineServing:
    """One policy line: the version the registry publishes, the one vLLM serves (None: none)."""

    served_name: str
    registry: str | None
    serving: str | None
    registry_sha256: str | None = None
    serving_sha256: str | None = None

    @property
    def current(self) -> bool:
        """vLLM serves the registry's version (by manifest hash where both are known, else by name)."""
        if self.registry is None or self.serving is None:
            return self.registry == self.serving
        if self.registry_sha256 and self.serving_sha256:
            return self.registry_sha256 == self.serving_sha256
        return self.registry == self.serving


def compare(
    client: VllmClient, rows: Iterable[dict[str, Any]], served_name: str, *, hashes: ManifestHashes | None = None
) -> list[LineServing]:
    """Every policy line the registry publishes or vLLM serves: the registry's version next to vLLM's (the
    last part of the adapter's folder, as the gateway records it; for full weights, of the base model's)."""
    hashes = hashes or ManifestHashes()
    want = serving_rows(rows, served_name)
    models = client.models()
    base_root = next((str(m.get("root") or "") for m in models if not m.get("parent")), "")
    roots = {
        str(m["id"]): str(m.get("root") or "")
        for m in models
        if m.get("parent") and _is_line(str(m.get("id")), served_name)
    }
    out = []
    for name in sorted(set(want) | set(roots)):
        row = want.get(name)
        root = base_root if row is not None and row["kind"] == "full" else roots.get(name, "")
        out.append(
            LineServing(
                served_name=name,
                registry=row["version"] if row else None,
                serving=Path(root).name if root else None,
                registry_sha256=row.get("manifest_sha256") if row else None,
                serving_sha256=hashes.sha256(root) if root else None,
            )
        )
    return out


def _is_line(name: str, served_name: str) -> bool:
    """A policy line's name, not an eval-gate candidate's (``<name>-candidate-<version>``)."""
    return (name == served_name or name.startswith(f"{served_name}-")) and "-candidate-" not in name
