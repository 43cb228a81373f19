"""Verifying retokenized calls against the served model: vLLM's own ``/tokenize`` of the same chat.

The retokenizer renders with the policy's template from its model folder; the served model may
render otherwise (another template file, a newer vLLM's message handling). Asking the server that
samples the policy to tokenize the same messages and tools says which: equal prompt ids make a call
``verified``, other ids ``mismatch``; no answer leaves it ``unverified``. One run asks each distinct
chat once, and stops asking after the first connection failure (the server is down: the rest of the
batch would only wait for timeouts).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from pipelines.gold.retokenize import normalize
from schemas.config import Settings

EXACT, VERIFIED, UNVERIFIED, MISMATCH = "exact", "verified", "unverified", "mismatch"
STATUSES = (EXACT, VERIFIED, UNVERIFIED, MISMATCH)
TOKEN_STATUS_PREFIX = "token_status_"  # the gold step's metadata: calls per status
# a merged transition is as doubtful as its most doubtful call
_RANK = {s: i for i, s in enumerate(STATUSES)}


def worst(a: str, b: str) -> str:
    """The status of a transition made of calls with statuses ``a`` and ``b``."""
    return a if _RANK.get(a, len(STATUSES)) >= _RANK.get(b, len(STATUSES)) else b


def wire_messages(messages: Any) -> list[dict[str, Any]]:  # noqa: ANN401 - JSON text or parsed
    """Messages as an OpenAI client sends them (tool-call arguments as JSON strings)."""
    out = []
    for m in normalize(messages):
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c["function"])
                if not isinstance(fn.get("arguments"), str):
                    fn["arguments"] = json.dumps(fn.get("arguments") or {}, ensure_ascii=False)
                calls.append({**c, "function": fn})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


class TokenizeEndpoint:
    """The prompt ids a vLLM server renders for a chat (``POST {url}/tokenize``), memoized per chat."""

    def __init__(self, url: str, model: str, *, timeout_s: float = 2.0, client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.down = False
        self._client = client
        self._memo: dict[tuple[str, str], list[int] | None] = {}

    def __call__(self, input_messages: Any, tools: Any = None) -> list[int] | None:  # noqa: ANN401 - JSON
        """The server's prompt ids (generation prompt added), or None when it cannot answer."""
        if self.down:
            return None
        messages = wire_messages(input_messages)
        tool_list = json.loads(tools) if isinstance(tools, str) and tools.strip() else tools or None
        key = (json.dumps(messages, sort_keys=True), json.dumps(tool_list, sort_keys=True))
        if key in self._memo:
            return self._memo[key]
        body: dict[str, Any] = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        if tool_list:
            body["tools"] = tool_list
        client = self._client or httpx.Client(timeout=self.timeout_s)
        try:
            response = client.post(f"{self.url}/tokenize", json=body, timeout=self.timeout_s)
        except httpx.TransportError:
            self.down = True
            return None
        finally:
            if self._client is None:
                client.close()
        try:
            ids = response.json().get("tokens") if response.status_code == 200 else None
        except (ValueError, AttributeError):  # not vLLM's answer: nothing to verify with
            ids = None
        self._memo[key] = [int(t) for t in ids] if isinstance(ids, list) else None
        return self._memo[key]


def policy_verifier(settings: Settings) -> TokenizeEndpoint | None:
    """The policy's vLLM (``vllm.url``, its base model's name) as a verifier; None when
    ``credit.verify_tokens`` is off. What the `transitions` asset, a replay and a variant rebuild use."""
    if not settings.credit.verify_tokens:
        return None
    credit = settings.credit
    return TokenizeEndpoint(settings.vllm.url, settings.model.base_served_name, timeout_s=credit.verify_timeout_s)


def status(prompt_ids: list[int] | None, served: list[int] | None) -> str:
    """A retokenized call's status, from its prompt ids and the server's (None: no answer)."""
    if served is None or prompt_ids is None:
        return UNVERIFIED
    return VERIFIED if list(prompt_ids) == list(served) else MISMATCH
