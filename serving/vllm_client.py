"""The few vLLM endpoints publishing needs: list models (adapters and the base), load/unload a LoRA adapter,
complete, health.

One small synchronous client over httpx, so the publisher, the evaluation gate and a replica's loader
speak to vLLM the same way; every failure becomes ``PublishError`` with vLLM's own message (serving is
unchanged). A vLLM started with ``--api-key`` refuses calls without it: ``api_key`` is sent as a bearer
token (``vllm.api_key_env`` names the environment variable that holds it).
"""

from __future__ import annotations

from typing import Any

import httpx

from serving.errors import PublishError


class VllmClient:
    """The few vLLM endpoints publishing needs; errors become ``PublishError`` with vLLM's message."""

    def __init__(self, url: str, *, timeout_s: float = 120.0, api_key: str = "") -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers)

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            resp = self.http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise PublishError(f"vLLM at {self.url} unreachable ({type(exc).__name__}: {exc})") from exc
        if resp.status_code >= 400:
            raise PublishError(f"vLLM {path} answered {resp.status_code}: {resp.text[:500]}")
        return resp

    def models(self) -> list[dict[str, Any]]:
        try:
            resp = self.http.get("/v1/models")
        except httpx.HTTPError as exc:
            raise PublishError(f"vLLM at {self.url} unreachable ({type(exc).__name__}: {exc})") from exc
        try:
            resp.raise_for_status()
            return list(resp.json()["data"])
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise PublishError(f"vLLM at {self.url}: cannot list models ({exc})") from exc

    def adapter_root(self, name: str) -> str | None:
        """The folder vLLM loaded the adapter ``name`` from (its ``root``), or None when none is served."""
        for m in self.models():
            if m.get("id") == name and m.get("parent"):
                return str(m.get("root") or "") or None
        return None

    def base_model(self) -> tuple[str, str] | None:
        """The served base model as (its name, the folder vLLM loaded it from: ``root``), or None when vLLM
        lists none. A full-weight version is served as the base model, so this is how a restart is checked."""
        for m in self.models():
            if not m.get("parent"):
                return str(m.get("id")), str(m.get("root") or "")
        return None

    def load_lora(self, name: str, path: str, *, inplace: bool = True) -> None:
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": inplace})

    def unload_lora(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name})

    def complete(self, model: str, prompt: str, *, max_tokens: int = 32, temperature: float = 0.0) -> str:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
        return str(self._post("/v1/completions", body).json()["choices"][0]["text"])

    def healthy(self) -> bool:
        try:
            return self.http.get("/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        self.http.close()
