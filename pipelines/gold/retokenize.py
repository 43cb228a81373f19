"""Token ids for LLM calls that only recorded messages, from the policy's own chat template.

Such rows are flagged ``token_source = 'retokenized'``: the ids are what the policy *would* have
seen, not necessarily what it sampled, and they carry no behaviour logprobs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from schemas.config import Settings


def _normalize(messages: Any) -> list[dict[str, str]]:
    """OTel GenAI (`parts`), OpenAI (`content`) or OpenInference messages to {role, content}."""
    if isinstance(messages, str):
        messages = json.loads(messages)
    if isinstance(messages, dict):
        messages = [messages]
    out = []
    for m in messages or []:
        content = m.get("content")
        if content is None and isinstance(m.get("parts"), list):
            content = "".join(str(p.get("content", "")) for p in m["parts"] if isinstance(p, dict))
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        out.append({"role": str(m.get("role", "user")), "content": "" if content is None else str(content)})
    return out


def _ids(encoded: Any) -> list[int]:
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

    def encode(self, input_messages: str | None, output_messages: str | None) -> tuple[list[int], list[int]] | None:
        """(prompt ids, response ids), or None when the call has no messages to tokenize."""
        if not input_messages or not output_messages:
            return None
        prompt_msgs = _normalize(input_messages)
        response_msgs = _normalize(output_messages)
        if not prompt_msgs or not response_msgs:
            return None
        tok = self.tokenizer
        prompt = _ids(tok.apply_chat_template(prompt_msgs, add_generation_prompt=True, tokenize=True))
        full = _ids(tok.apply_chat_template(prompt_msgs + response_msgs, tokenize=True))
        if full[: len(prompt)] == prompt and len(full) > len(prompt):
            return prompt, full[len(prompt) :]
        # Templates that rewrite earlier turns: fall back to the plain response text.
        text = "".join(m["content"] for m in response_msgs)
        response = _ids(tok(text, add_special_tokens=False)["input_ids"])
        if tok.eos_token_id is not None:
            response.append(int(tok.eos_token_id))
        return prompt, response


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
