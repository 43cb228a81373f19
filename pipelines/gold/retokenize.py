"""Token ids for LLM calls that only recorded messages, from the policy's own chat template.

Such rows are flagged ``token_source = 'retokenized'``: the ids are what the policy *would* have
seen, not necessarily what it sampled, and they carry no behaviour logprobs.

Exact retokenization renders what vLLM renders and cuts what the model generated:

- the prompt is ``apply_chat_template(messages, tools=tools, add_generation_prompt=True)`` of the
  messages as vLLM passes them to the template (OpenAI shape kept: tool calls with their arguments
  parsed to objects, as ``vllm.renderers.chat_utils._postprocess_messages`` does; tool results with
  their ``tool_call_id``; text content parts joined with newlines);
- the response is the text the full history (prompt + output messages) adds after the prompt, cut
  just after the template's end-of-turn token (derived from the template, e.g. ``<|im_end|>``):
  vLLM's completion ids end there, the newline a template puts between turns is not generated.
  Tool calls render as the template renders them, which for a template matching its tool parser
  (hermes) is the model's raw text.
- reasoning: when the template does not render ``reasoning_content`` itself, the response's
  reasoning goes back in front of its content as ``<think>{reasoning}</think>{content}``. Assumption
  (documented, not tested against a reasoning model here): vLLM's reasoning parsers (deepseek_r1,
  qwen3) partition the raw text at the think tags without stripping, so that concatenation is the
  text the model generated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import cached_property, lru_cache
from typing import Any

from schemas.config import Settings

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_MARK = "\u2063agentlake-probe\u2063"  # text no real conversation contains


def _loads(value: Any) -> Any:  # noqa: ANN401 - JSON text or already-parsed JSON
    if isinstance(value, str):
        return json.loads(value) if value.strip() else None
    return value


def _text(content: Any) -> str | None:  # noqa: ANN401 - str, content parts, None
    """Message content as the string vLLM gives the template (text parts joined with newlines)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return str(content)


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call with its arguments parsed to an object, as vLLM hands it to the template."""
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args) if args.strip() else {}
        except ValueError:
            pass  # not JSON: the template renders the string as given
    out: dict[str, Any] = {"type": call.get("type") or "function", "function": fn}
    if call.get("id") is not None:
        out["id"] = call["id"]
    return out


def normalize(messages: Any) -> list[dict[str, Any]]:  # noqa: ANN401 - JSON text or parsed messages
    """OpenAI chat messages (tool calls, tool results, reasoning), OTel GenAI (``parts``) or legacy
    {role, content} rows, to the OpenAI shape the chat template is rendered with."""
    messages = _loads(messages)
    if isinstance(messages, dict):
        messages = [messages]
    out: list[dict[str, Any]] = []
    for m in messages or []:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if content is None and isinstance(m.get("parts"), list):
            content = "".join(str(p.get("content", "")) for p in m["parts"] if isinstance(p, dict))
        msg: dict[str, Any] = {"role": str(m.get("role") or "user")}
        calls = [_tool_call(c) for c in m.get("tool_calls") or [] if isinstance(c, dict)]
        text = _text(content)
        msg["content"] = text if text is not None or calls else ""
        if calls:
            msg["tool_calls"] = calls
        for key in ("tool_call_id", "name", "reasoning_content"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    return out


def _ids(encoded: Any) -> list[int]:  # noqa: ANN401 - a list or a BatchEncoding
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):  # transformers 5 may return a BatchEncoding
        encoded = encoded["input_ids"]
    return [int(x) for x in encoded]


class Retokenizer:
    """Wraps a Hugging Face tokenizer folder (the policy's) and its chat template: the folder's own, or
    ``chat_template`` (a Jinja file, ``model.chat_template``) in its place, as vLLM and the trainer use."""

    def __init__(self, path: str, chat_template: str = "") -> None:
        from transformers import AutoTokenizer

        from trainer.chat_template import apply

        self.path = path
        self.tokenizer = apply(AutoTokenizer.from_pretrained(path), chat_template)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer in {path} has no chat template; the policy's template is required")

    def render(self, messages: list[dict[str, Any]], tools: list[Any] | None, *, generation: bool) -> str:
        """The template's text for ``messages`` (and ``tools``), as vLLM renders it."""
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation}
        if tools:
            kwargs["tools"] = tools
        return str(self.tokenizer.apply_chat_template(messages, **kwargs))

    def ids(self, text: str) -> list[int]:
        """``text``'s ids as vLLM tokenizes a rendered chat (no special tokens added)."""
        return _ids(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @cached_property
    def turn_end(self) -> str:
        """The text that ends a generated assistant turn: what the template writes right after an
        assistant's content, up to the whitespace between turns (``<|im_end|>`` for ChatML); the
        tokenizer's eos token when the template writes nothing there."""
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]
        text = self.render(probe, None, generation=False)
        after = text[text.rfind(_MARK) + len(_MARK) :] if _MARK in text else ""
        return after.strip() or str(self.tokenizer.eos_token or "")

    @cached_property
    def renders_reasoning(self) -> bool:
        """Whether the template writes an assistant's ``reasoning_content`` itself."""
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "reasoning_content": _MARK}]
        return _MARK in self.render(probe, None, generation=False)

    def _as_generated(self, message: dict[str, Any]) -> dict[str, Any]:
        """A response message with its reasoning back in its text, when the template would drop it."""
        reasoning = message.get("reasoning_content")
        if message.get("role") != "assistant" or not reasoning or self.renders_reasoning:
            return message
        out = {k: v for k, v in message.items() if k != "reasoning_content"}
        out["content"] = f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{message.get('content') or ''}"
        return out

    def prompt_ids(self, input_messages: Any, tools: Any = None) -> list[int] | None:  # noqa: ANN401 - JSON
        """The prompt vLLM renders for these messages and tools (None: no messages)."""
        msgs = normalize(input_messages)
        return self.ids(self.render(msgs, _loads(tools) or None, generation=True)) if msgs else None

    def encode(
        self,
        input_messages: Any,
        output_messages: Any,
        tools: Any = None,  # noqa: ANN401 - JSON text
    ) -> tuple[list[int], list[int]] | None:
        """(prompt ids, response ids), or None when the call has no messages to tokenize."""
        if not input_messages or not output_messages:
            return None
        prompt_msgs = normalize(input_messages)
        response_msgs = [self._as_generated(m) for m in normalize(output_messages)]
        if not prompt_msgs or not response_msgs:
            return None
        tool_list = _loads(tools) or None
        prompt = self.render(prompt_msgs, tool_list, generation=True)
        full = self.render(prompt_msgs + response_msgs, tool_list, generation=False)
        if full.startswith(prompt) and len(full) > len(prompt):
            response = full[len(prompt) :]
            end = self.turn_end
            cut = response.rfind(end) if end else -1
            response = response[: cut + len(end)] if cut >= 0 else response.rstrip()
            return self.ids(prompt), self.ids(response)
        # Templates that rewrite earlier turns: fall back to the plain response text.
        text = "".join(str(m.get("content") or "") for m in response_msgs)
        ids = self.ids(text)
        if self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        return self.ids(prompt), ids


@lru_cache(maxsize=4)
def load(path: str, chat_template: str = "") -> Retokenizer:
    """One tokenizer per process, path and template: loading it is the slow part."""
    return Retokenizer(path, chat_template)


def tokenizer_dir(settings: Settings) -> str:
    """The policy's tokenizer folder: the base model's (``trainer.model_store.find_model``), or where a pull
    will put it (``<cache_dir>/<name>``, not there yet)."""
    from trainer.model_store import find_model

    base = settings.model.base
    found = find_model(base, settings.model.cache_dir)
    return str(found) if found is not None else str(settings.model.cache_dir / base)


def chat_template_file(settings: Settings) -> str:
    """``model.chat_template`` as the retokenizer takes it ("": the tokenizer folder's own template)."""
    return str(settings.model.chat_template) if settings.model.chat_template is not None else ""


def policy_retokenizer(settings: Settings) -> Callable[[], Retokenizer | None]:
    """Loads the policy's tokenizer when first called (None when the folder does not exist yet)."""
    path, template = tokenizer_dir(settings), chat_template_file(settings)
    return lambda: load(path, template) if os.path.isdir(path) else None
