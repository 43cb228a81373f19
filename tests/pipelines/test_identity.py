"""Rollout identity is a property of the whole trace, whatever order and request its pieces come in.

Spans are made with the real OTel SDK and encoded as the collector writes them; each delivery is
committed to a real Delta `spans` table with its offsets, then the incremental steps run, as the
Dagster assets do between two ingest runs. (The same workloads through the real collector and
broker are in tests/lake/.)
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context

from pipelines.bronze.decoding import KafkaRecord, decode_spans
from pipelines.gold.transitions_step import update_transitions
from pipelines.silver.identity import resolve_rollouts
from pipelines.silver.trajectories_step import update_trajectories
from schemas import attributes as A
from schemas.config import CreditSettings, KafkaSettings
from schemas.lake import Lake
from tests.pipelines.otel import MS, encode

KAFKA = KafkaSettings(bootstrap_servers="unused:9092", spans_topic="s", rewards_topic="r")
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
T0 = 1_750_000_000_000 * MS // 1000


class Deliveries:
    """A `spans` partition that grows one OTLP request at a time, with the steps run after each."""

    def __init__(self, root: Path) -> None:
        self.lake = Lake(str(root))
        self.offset = 0

    def deliver(self, spans: Sequence[ReadableSpan], *, run: bool = True) -> None:
        trace = format(spans[0].context.trace_id, "032x").encode()
        rec = KafkaRecord("s", 0, self.offset, trace, encode(spans), [])
        self.lake.write("spans", decode_spans([rec])[0], txns={"kafka:s:0": self.offset})
        self.offset += 1
        if run:
            self.run()

    def run(self) -> None:
        update_trajectories(self.lake, KAFKA, idle_timeout_s=1e9, now=NOW)
        update_transitions(self.lake, CreditSettings(), now=NOW)

    def table(self, name: str) -> pl.DataFrame:
        frame = pl.read_delta(self.lake.uri(name)).drop("updated_at", "created_at", strict=False)
        return frame.sort(frame.columns[:3])


def split_rollout(rollout_id: str, n_calls: int, *, reward: float = 1.0) -> tuple[list[ReadableSpan], ReadableSpan]:
    """A rollout whose id is on the root span only, as Agent Lightning writes it: (children, root)."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({A.SERVICE_NAME: "agent"}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tp.get_tracer("test")
    root = tracer.start_span(
        A.ROLLOUT_SPAN_NAME, start_time=T0, attributes={A.ROLLOUT_ID: rollout_id, A.TASK_ID: "task"}
    )
    ctx = set_span_in_context(root)
    t = T0
    for i in range(n_calls):
        t += 10 * MS
        attrs: dict[str, Any] = {
            A.LLM_PROMPT_TOKEN_IDS: [1, 2, i],
            A.LLM_COMPLETION_TOKEN_IDS: [3, i],
            A.LLM_COMPLETION_LOGPROBS: [-0.5, -0.25],
            A.LLM_RESPONSE_ID: f"{rollout_id}-call-{i}",
        }
        tracer.start_span(A.LLM_CALL_SPAN_NAME, context=ctx, start_time=t, attributes=attrs).end(end_time=t + MS)
    tracer.start_span(A.REWARD_SPAN_NAME, context=ctx, start_time=t + 2 * MS, attributes={A.REWARD_VALUE: reward}).end(
        end_time=t + 3 * MS
    )
    root.end(end_time=t + 5 * MS)
    tp.shutdown()
    spans = list(exporter.get_finished_spans())
    return spans[:-1], spans[-1]


@pytest.mark.parametrize("pieces", [1, 2, 4])
def test_a_trace_exported_in_pieces_children_first_keeps_its_rollout(tmp_path: Path, pieces: int) -> None:
    children, root = split_rollout("r-1", 3)
    inc = Deliveries(tmp_path / "incremental")
    for i in range(pieces):
        inc.deliver(children[i::pieces])
    inc.deliver([root])

    traj = inc.table("trajectories")
    assert traj["rollout_id"].to_list() == ["r-1"]  # no trajectory filed under the trace id
    assert traj["n_llm_calls"].to_list() == [3] and traj["final_reward"].to_list() == [1.0]
    assert traj["status"].to_list() == ["finished"]
    trans = inc.table("transitions")
    assert trans["rollout_id"].to_list() == ["r-1"] * 3 and trans["step"].to_list() == [0, 1, 2]

    once = Deliveries(tmp_path / "rebuild")
    once.deliver([*children, root])
    assert inc.table("trajectories").equals(once.table("trajectories"))
    assert inc.table("transitions").equals(once.table("transitions"))


def test_root_first_then_children_in_a_later_request(tmp_path: Path) -> None:
    children, root = split_rollout("r-2", 2)
    inc = Deliveries(tmp_path / "lake")
    inc.deliver([root])
    inc.deliver(children)
    traj = inc.table("trajectories")
    assert traj["rollout_id"].to_list() == ["r-2"] and traj["n_llm_calls"].to_list() == [2]


def test_a_trace_that_names_two_rollouts_resolves_to_one_whatever_the_order() -> None:
    base = {"tenant": "t", "trace_id": "aa", "attempt_id": None, "service_name": "x", "llm_response_id": None}
    rows = [{**base, "rollout_id": r} for r in ("aa", "zeta", "alpha", "aa")]
    for order in (rows, rows[::-1]):
        assert resolve_rollouts(pl.DataFrame(order))["rollout_id"].unique().to_list() == ["alpha"]


def test_the_same_trace_id_in_two_tenants_stays_apart() -> None:
    base = {"trace_id": "aa", "attempt_id": None, "service_name": "x", "llm_response_id": None}
    rows = [{**base, "tenant": "a", "rollout_id": "ra"}, {**base, "tenant": "b", "rollout_id": "aa"}]
    out = resolve_rollouts(pl.DataFrame(rows)).sort("tenant")
    assert out["rollout_id"].to_list() == ["ra", "aa"]


def openinference_client(rollout_id: str, response_id: str) -> list[ReadableSpan]:
    """An agent instrumented with OpenInference: no trace context reaches the gateway, no token ids."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({A.SERVICE_NAME: "client"}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tp.get_tracer("openinference")
    root = tracer.start_span("agent", start_time=T0, attributes={A.ROLLOUT_ID: rollout_id, A.TASK_ID: "t"})
    ctx = set_span_in_context(root)
    raw = {"id": response_id, "object": "chat.completion", "choices": [{"message": {"content": "4"}}]}
    attrs = {
        A.OI_SPAN_KIND: "LLM",
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": "2+2?",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": "4",
        A.OI_OUTPUT_VALUE: json.dumps(raw),
        "output.mime_type": "application/json",
    }
    tracer.start_span("ChatCompletion", context=ctx, start_time=T0 + MS, attributes=attrs).end(end_time=T0 + 9 * MS)
    tracer.start_span(A.REWARD_SPAN_NAME, context=ctx, start_time=T0 + 10 * MS, attributes={A.REWARD_VALUE: 1.0}).end(
        end_time=T0 + 11 * MS
    )
    root.end(end_time=T0 + 12 * MS)
    tp.shutdown()
    return list(exporter.get_finished_spans())


def gateway_call(response_id: str) -> list[ReadableSpan]:
    """The gateway's span of the same call: its own trace (no traceparent came in), exact tokens."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({A.SERVICE_NAME: A.GATEWAY_SERVICE_NAME}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    attrs = {
        A.LLM_PROMPT_TOKEN_IDS: [5, 6, 7],
        A.LLM_COMPLETION_TOKEN_IDS: [8],
        A.LLM_COMPLETION_LOGPROBS: [-0.1],
        A.LLM_RESPONSE_ID: response_id,
        A.LLM_POLICY_VERSION: "v1",
    }
    tracer = tp.get_tracer("agentlake.gateway")
    tracer.start_span(A.LLM_CALL_SPAN_NAME, start_time=T0 + 2 * MS, attributes=attrs).end(end_time=T0 + 8 * MS)
    tp.shutdown()
    return list(exporter.get_finished_spans())


@pytest.mark.parametrize("gateway_first", [True, False])
def test_a_client_without_trace_context_gets_the_gateways_exact_tokens(tmp_path: Path, gateway_first: bool) -> None:
    client, gateway = openinference_client("r-oi", "chatcmpl-42"), gateway_call("chatcmpl-42")
    inc = Deliveries(tmp_path / "lake")
    for spans in (gateway, client) if gateway_first else (client, gateway):
        inc.deliver(spans)
    traj = inc.table("trajectories")
    assert traj["rollout_id"].to_list() == ["r-oi"]  # no trajectory of the gateway's own trace
    assert traj["n_llm_calls"].to_list() == [1]
    trans = inc.table("transitions")
    assert trans["token_source"].to_list() == ["exact"]
    assert trans["prompt_ids"].to_list() == [[5, 6, 7]] and trans["response_ids"].to_list() == [[8]]
    assert trans["reward"].to_list() == [1.0] and trans["policy_version"].to_list() == ["v1"]
