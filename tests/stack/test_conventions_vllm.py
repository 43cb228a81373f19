"""Each trace convention, end to end against real vLLM: the real OpenAI client, instrumented by the real
library, asks the session's vLLM (the shipped tool-rendering template, the hermes parser) with ``tools=``;
the library's span goes through the real bronze decoding (our convention adapter), is retokenized by
`pipelines.gold.retokenize.Retokenizer`, and must equal what vLLM served: the prompt its
``prompt_token_ids``, the response its completion ``token_ids`` (``return_token_ids``).

Histories are generated (`tests.pipelines.test_retokenize_exact.histories`: text, single and parallel tool
calls, tool results, several turns; earlier assistant turns may carry the ``reasoning`` the model wrote, which
the shipped template does not render: a library or adapter that moved it into the text would break the
prompt). The served 135M model runs without a reasoning parser, so no reply carries reasoning.

The response rules are `tests.stack.test_retokenize_vllm`'s: a reply cut by ``max_tokens`` has no end-of-turn
token and is compared without it; a tool call the model wrote in another JSON spacing than the template's is
counted, not compared (it must still parse to the calls the span holds); so is a reply the model sampled in a
non-canonical split into tokens (the same text, other ids: no retokenizer recovers that from text).

What a library cannot record, said here rather than hidden:

- opentelemetry-instrumentation-openai-v2 (OTel GenAI) records no tool definitions: its span alone cannot give
  the prompt of a request with ``tools`` (the template renders them into the system turn). The test checks that
  loss (without the tools the prompt differs) and then retokenizes with the request's tools: everything the
  span does record must be exact. It also drops a user message's list of content parts (not generated here:
  `histories` sends text).
- Agent Lightning's LLM proxy records no messages of its own, only the token ids vLLM returned (the
  ``prompt_token_ids`` / ``response_token_ids`` attributes its LiteLLM patch writes, or its Weave tracer's
  ``agentlightning.operation.output.*``). The library itself cannot be installed beside this stack (its
  LiteLLM proxy pins other polars and huggingface_hub versions), so those spans are written here with the
  attribute names its source writes and reads (agentlightning 0.2.x ``instrumentation/litellm.py``,
  ``adapter/triplet.py``), filled with what real vLLM answered; decoding must give back exactly those ids.

``FUZZ_EXAMPLES`` (default 3) sets the generated histories per convention; the outcomes are printed (``-s``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipelines.gold.retokenize import Retokenizer
from schemas import attributes as A
from tests.fixtures_vllm import VllmServer
from tests.pipelines.conventions_fixtures import LIBRARIES, decode, instrumented
from tests.pipelines.test_retokenize_exact import histories, words
from tests.stack.test_retokenize_vllm import compare

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "3"))
HYPOTHESIS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    phases=[Phase.generate],  # vLLM answers are not replayed from a database
    suppress_health_check=list(HealthCheck),
)


@st.composite
def agent_histories(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) as an agent sends them: `histories`, some earlier assistant turns with the
    ``reasoning`` the model wrote (the key vLLM reads on a request's assistant message)."""
    messages, _, tools = draw(histories())
    for m in messages:
        if m["role"] == "assistant" and draw(st.booleans()):
            m["reasoning"] = draw(words)
    return messages, tools


@pytest.fixture(scope="module")
def retok(vllm_server: VllmServer) -> Retokenizer:
    """The served model folder's tokenizer and template (the template vLLM renders with)."""
    return Retokenizer(str(vllm_server.model_path))


def _ask(
    client: openai.OpenAI, server: VllmServer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[tuple[list[int], list[int]], str, str]:
    """One chat call as an agent makes it, with vLLM's token ids asked for: ((prompt, completion ids), finish
    reason, response id)."""
    kwargs: dict[str, Any] = {"tools": tools, "tool_choice": "auto"} if tools else {}
    answer = client.chat.completions.create(
        model=server.served_name,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0,
        extra_body={"return_token_ids": True},
        **kwargs,
    )
    data = answer.model_dump()
    choice = data["choices"][0]
    prompt = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
    return (prompt, choice["token_ids"]), choice["finish_reason"], data["id"]


def _client(server: VllmServer) -> openai.OpenAI:
    """The real OpenAI client on the session's vLLM; a long timeout: CPU vLLM on a loaded machine is slow."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.mark.parametrize("name", list(LIBRARIES))
def test_a_library_span_retokenizes_to_what_vllm_served(
    name: str, vllm_server: VllmServer, retok: Retokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = LIBRARIES[name]
    outcomes: Counter[str] = Counter()
    with instrumented(library, monkeypatch) as recorder:
        client = _client(vllm_server)

        @HYPOTHESIS
        @given(history=agent_histories())
        def check(history: Any) -> None:  # noqa: ANN401
            messages, tools = history
            recorder.exporter.clear()
            served, finish, _ = _ask(client, vllm_server, messages, tools)
            (span,) = recorder.exporter.get_finished_spans()
            row = decode(span)
            recorded_tools = row["tools"]
            if tools and not library.tools:  # the library's loss, shown: then the rest must be exact
                assert recorded_tools is None
                assert retok.prompt_ids(row["input_messages"]) != served[0]
                recorded_tools = json.dumps(tools)
                outcomes["tools_not_recorded"] += 1
            enc = retok.encode(row["input_messages"], row["output_messages"], recorded_tools)
            outcomes[compare(retok, enc, served, finish, json.loads(row["output_messages"]))] += 1

        check()
    print(f"{name}: {sum(outcomes.values()) - outcomes['tools_not_recorded']} calls, {dict(outcomes)}")
    assert sum(outcomes.values()) >= EXAMPLES


# --- Agent Lightning: token ids on the span -------------------------------------------------------------------

# (prompt key, completion key) as Agent Lightning writes them: its LiteLLM patch on the proxy's span
# (`instrumentation/litellm.py`: ``response_token_ids`` is ``response_token_ids[0]`` of the answer), and its
# Weave tracer's flattened output object (`adapter/triplet.py`), of old vLLM's patched answer, of vLLM >= 0.10.2
# (``choices.0.token_ids``) and of that answer through LiteLLM
AGL_LAYOUTS = {
    "litellm": (A.AGL_PROMPT_TOKEN_IDS, A.AGL_RESPONSE_TOKEN_IDS),
    **{
        f"weave:{k.removeprefix(A.AGL_WEAVE_OUTPUT)}": (A.AGL_WEAVE_PROMPT_TOKEN_IDS, k)
        for k in A.AGL_WEAVE_RESPONSE_TOKEN_IDS
    },
}


def _agl_span(layout: str, rollout: str, served: tuple[list[int], list[int]], response_id: str) -> ReadableSpan:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    prompt_key, completion_key = AGL_LAYOUTS[layout]
    attrs: dict[str, Any] = {A.AGL_ROLLOUT_ID: rollout, prompt_key: served[0], completion_key: served[1]}
    if layout.startswith("weave"):
        attrs[A.AGL_WEAVE_RESPONSE_ID] = response_id
    with provider.get_tracer("agentlightning").start_as_current_span("openai.chat.completion", attributes=attrs):
        pass
    (span,) = exporter.get_finished_spans()
    return span


def test_agent_lightning_spans_keep_the_ids_vllm_served(vllm_server: VllmServer) -> None:
    """The prompt and completion ids decoding reads from an Agent Lightning span, in each of its layouts, are
    the ids vLLM served (and the Weave layout's response id is the answer's)."""
    client = _client(vllm_server)
    seen: Counter[str] = Counter()

    @HYPOTHESIS
    @given(history=histories())
    def check(history: Any) -> None:  # noqa: ANN401
        messages, _, tools = history
        served, finish, response_id = _ask(client, vllm_server, messages, tools)
        for layout in AGL_LAYOUTS:
            row = decode(_agl_span(layout, "agl-r1", served, response_id))
            assert row["rollout_id"] == "agl-r1"
            assert (row["prompt_token_ids"], row["completion_token_ids"]) == served, layout
            assert row["input_messages"] is None  # the proxy's span keeps ids, not messages
            if layout.startswith("weave"):
                assert row["llm_response_id"] == response_id
        seen[finish] += 1

    check()
    print(f"agentlightning ({len(AGL_LAYOUTS)} layouts): {dict(seen)}")
    assert sum(seen.values()) >= EXAMPLES
