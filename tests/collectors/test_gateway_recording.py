"""What a call becomes, checked on plain dicts: no server, no HTTP (collectors.gateway.recording)."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.errors import SinkUnavailable
from collectors.gateway.recording import (
    CallRecorder,
    ClientExtras,
    ServedPolicy,
    StreamedAnswer,
    choice_calls,
    request_call,
    served_policy,
    upstream_body,
)
from collectors.sink import MemorySink
from schemas import attributes as A
from schemas.manifest import MANIFEST_FILE, ManifestHashes


def test_upstream_body_forces_ids_logprobs_and_streamed_usage() -> None:
    body = {"model": "m", "messages": [], "stream": True, "stream_options": {"continuous_usage_stats": False}}
    up = upstream_body(body, "chat")
    assert up["return_token_ids"] is True and up["logprobs"] is True
    assert up["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert "return_token_ids" not in body  # the client's request is left as it was
    assert upstream_body({"prompt": "x"}, "completions")["logprobs"] == 0
    assert upstream_body({"prompt": "x", "logprobs": 3}, "completions")["logprobs"] == 3


def test_client_extras_keep_only_what_the_client_asked_for() -> None:
    answer = {
        "prompt_token_ids": [1, 2],
        "usage": {"completion_tokens": 2},
        "choices": [{"index": 0, "token_ids": [3, 4], "logprobs": {"content": []}}],
    }
    stripped = ClientExtras({"messages": []}, "chat").strip(dict(answer, choices=[dict(answer["choices"][0])]))
    assert stripped == {"usage": {"completion_tokens": 2}, "choices": [{"index": 0, "logprobs": None}]}
    kept = ClientExtras({"return_token_ids": True, "logprobs": True}, "chat").strip(
        dict(answer, choices=[dict(answer["choices"][0])])
    )
    assert kept == answer
    usage_only = {"choices": [], "usage": {"prompt_tokens": 2}}
    assert ClientExtras({"stream": True}, "chat").strip(usage_only, chunk=True) is None


def test_a_streamed_answer_becomes_the_non_streamed_shape() -> None:
    acc = StreamedAnswer("chat")
    acc.add({"id": "c1", "model": "m", "prompt_token_ids": [1, 2], "choices": []})
    for n, piece in enumerate(("Hel", "lo")):
        lp = {"content": [{"logprob": -0.5 * (n + 1)}]}
        acc.add(
            {"id": "c1", "choices": [{"index": 0, "delta": {"content": piece}, "token_ids": [10 + n], "logprobs": lp}]}
        )
    acc.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"completion_tokens": 2}})
    assert acc.as_response() == {
        "id": "c1",
        "model": "m",
        "usage": {"completion_tokens": 2},
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "index": 0,
                "token_ids": [10, 11],
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Hello"},
                "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.0}]},
            }
        ],
    }


def test_streamed_tool_call_and_reasoning_deltas_become_the_unstreamed_message() -> None:
    """Parallel tool calls streamed as vLLM streams them (the first delta of a call names it, the rest add
    argument pieces) and reasoning deltas: one message, as the same request answers without streaming."""
    acc = StreamedAnswer("chat")
    deltas: list[dict[str, Any]] = [
        {"reasoning_content": "think "},
        {"reasoning_content": "hard"},
        {"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "calc", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"expr": '}}]},
        {"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "search"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"1"}'}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]},
    ]
    for n, delta in enumerate(deltas):
        acc.add({"choices": [{"index": 0, "delta": delta, "token_ids": [n]}]})
    acc.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    (choice,) = acc.as_response()["choices"]
    assert choice["token_ids"] == list(range(len(deltas))) and choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "think hard",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "1"}'}},
            {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        ],
    }


def test_each_choice_is_its_own_call_in_the_callers_trace() -> None:
    parent = (b"\x01" * 16, b"\x02" * 8)
    base = request_call(
        {"model": "m", "prompt": "2+2="}, "completions", parent=parent, upstream="u", ids={}, tenant="t"
    )
    assert (base.trace_id, base.parent_span_id, base.operation) == (parent[0], parent[1], "text_completion")
    data = {
        "id": "cmpl-1",
        "model": "m",
        "prompt_token_ids": [5, 6],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3},
        "choices": [
            {"index": 0, "text": "4", "token_ids": [7], "logprobs": {"token_logprobs": [-0.1]}},
            {"index": 1, "text": "four", "token_ids": [8, 9], "logprobs": {"token_logprobs": [None, -0.2]}},
        ],
    }
    first, second = choice_calls(data, base, "completions")
    assert first.span_id == base.span_id and second.span_id != base.span_id
    assert {first.trace_id, second.trace_id} == {parent[0]}
    assert (first.choice_index, second.choice_index) == (0, 1)
    assert first.prompt_token_ids == second.prompt_token_ids == [5, 6]
    assert first.usage["completion_tokens"] == 1 and second.usage["completion_tokens"] == 2
    assert second.completion_logprobs is not None and math.isnan(second.completion_logprobs[0])
    assert second.output_message == {"role": "assistant", "content": "four"}


def test_served_policy_names_adapter_versions_by_their_folder() -> None:
    listed = {"policy": ("base", "/models/v0003/"), "base": (None, "/models/base")}
    assert served_policy("policy", listed) == ("policy", "policy@v0003", None)
    assert served_policy("base", listed) == (None, "base", None)
    assert served_policy(None, listed) == (None, None, None)


def test_served_policy_hashes_the_adapters_manifest_and_rereads_it_when_it_changes(tmp_path: Path) -> None:
    """The hash is of the manifest's bytes, as ``model_versions.manifest_sha256``; no file, no hash."""
    folder = tmp_path / "models" / "v0003"
    folder.mkdir(parents=True)
    manifest = folder / MANIFEST_FILE
    manifest.write_bytes(b'{"files": {}, "manifest": 1}\n')
    base = tmp_path / "base"  # a base model's folder: never hashed, even with a manifest in it
    base.mkdir()
    (base / MANIFEST_FILE).write_bytes(b"{}")
    listed = {"policy": ("base", str(folder)), "base": (None, str(base)), "gone": ("base", str(tmp_path / "v0009"))}
    hashes = ManifestHashes()
    first = served_policy("policy", listed, hashes=hashes)
    assert first == ("policy", "policy@v0003", hashlib.sha256(manifest.read_bytes()).hexdigest())
    manifest.write_bytes(b'{"files": {"adapter_model.safetensors": {}}, "manifest": 1}\n')  # new size
    second = served_policy("policy", listed, hashes=hashes)
    assert second.sha256 == hashlib.sha256(manifest.read_bytes()).hexdigest() != first.sha256
    assert served_policy("base", listed, hashes=hashes) == (None, "base", None)
    assert served_policy("gone", listed, hashes=hashes) == ("gone", "gone@v0009", None)  # not on this host
    manifest.unlink()
    assert served_policy("policy", listed, hashes=hashes).sha256 is None  # removed: the cache does not answer


def test_the_recorder_writes_spans_counts_losses_and_ends_rollouts_after_their_calls() -> None:
    async def policy(upstream: str, model: str | None) -> ServedPolicy:
        return ServedPolicy(None, model)

    async def scenario() -> tuple[MemorySink, CallRecorder, CallRecorder]:
        sink = MemorySink()
        recorder = CallRecorder(sink, topic="spans", policy=policy)
        base = request_call({"model": "m", "messages": []}, "chat", parent=None, upstream="u", ids={}, tenant="t")
        recorder.record(choice_calls({"model": "m", "choices": [{"index": 0}]}, base, "chat"))
        await recorder.end_rollout({A.ROLLOUT_ID: "r1"}, "finished", reward=1.0, reward_name=None, tenant="t")
        down = MemorySink()
        down.down = True
        lossy = CallRecorder(down, topic="spans", policy=policy)
        lossy.record([base])
        await lossy.close()
        return sink, recorder, lossy

    sink, recorder, lossy = asyncio.run(scenario())
    assert recorder.recorded_spans == 2 and len(sink.records) == 2  # the call, then the end
    assert (lossy.recorded_spans, lossy.record_failures) == (0, 1)


def test_the_end_of_a_rollout_raises_what_the_sink_raises() -> None:
    async def policy(upstream: str, model: str | None) -> ServedPolicy:
        return ServedPolicy(None, None)

    down = MemorySink()
    down.down = True
    recorder = CallRecorder(down, topic="spans", policy=policy)
    with pytest.raises(SinkUnavailable, match="marked down"):
        asyncio.run(recorder.end_rollout({A.ROLLOUT_ID: "r1"}, "failed", reward=None, reward_name=None, tenant="t"))
    assert recorder.recorded_spans == 0


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
_call = st.fixed_dictionaries(
    {
        "id": st.one_of(st.none(), st.from_regex(r"call_[a-z0-9]{1,8}", fullmatch=True)),
        "name": st.sampled_from(["calculate", "search", "no_such_tool"]),
        "arguments": st.one_of(st.just('{"expression": "2 * 3"}'), _text),  # not always JSON: kept as written
    }
)


@st.composite
def _streamed_reply(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A chat reply (text, reasoning, parallel tool calls) and its deltas, each string cut at random points."""
    content = draw(st.one_of(st.none(), _text))
    reasoning = draw(st.one_of(st.none(), _text.filter(bool)))
    calls = draw(st.lists(_call, max_size=3))
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ]
    if reasoning:
        message["reasoning_content"] = reasoning

    def pieces(text: str) -> list[str]:
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=3))) if len(text) > 1 else []
        return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]

    deltas: list[dict[str, Any]] = [{"role": "assistant"}]
    deltas += [{"reasoning_content": p} for p in pieces(reasoning or "")]
    deltas += [{"content": p} for p in pieces(content or "")]
    for index, c in enumerate(calls):
        deltas.append(
            {"tool_calls": [{"index": index, "id": c["id"], "type": "function", "function": {"name": c["name"]}}]}
        )
        deltas += [{"tool_calls": [{"index": index, "function": {"arguments": p}}]} for p in pieces(c["arguments"])]
    return message, deltas


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "100")), deadline=None)
@given(_streamed_reply())
def test_a_streamed_reply_with_tool_calls_is_recorded_as_the_same_call_unstreamed(
    reply: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    message, deltas = reply
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}
    base = request_call(body, "chat", parent=None, upstream="u", ids={}, tenant="t")
    acc = StreamedAnswer("chat")
    for delta in deltas:
        acc.add({"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta, "token_ids": [1]}]})
    (streamed,) = choice_calls(acc.as_response(), base, "chat")
    unstreamed_answer = {"id": "c1", "model": "m", "choices": [{"index": 0, "message": message, "token_ids": [1]}]}
    (unstreamed,) = choice_calls(unstreamed_answer, base, "chat")
    assert streamed.output_message == unstreamed.output_message
    # no text: null for a turn that only calls tools, else "" (a stream cannot tell "" from null)
    expected = {"content": message["content"] or (None if message.get("tool_calls") else "")}
    assert unstreamed.output_message == {**message, **expected}
    assert streamed.request_tools == [{"type": "function"}]
