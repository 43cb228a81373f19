"""200 rollouts in Agent Lightning's span format, each trace exported over several requests with its
children before its root (as the OTel ``BatchSpanProcessor`` sends a long rollout), through the real
collector and the real Dagster assets: 200 of 200 rollouts must come out as Agent Lightning's own
adapter reads them (issue 14, finding 1).

The spans are Agent Lightning's: LLM calls are ``openai.chat.completion`` spans with the token ids its
LLM proxy records (``prompt_token_ids`` / ``response_token_ids``) and a response id, rewards are
``agentlightning.annotation`` spans (``agentlightning.reward.0.value``), and the rollout is named by
``agentlake.rollout.id`` on the root span only. The reference is Agent Lightning's adapter semantics
(``TracerTraceToTriplet`` + LightningRL), written out below over the SDK's spans: the LLM calls of the
trace in start order, one per response id, each with the rollout's final reward (the last annotation).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode, set_span_in_context

from schemas import attributes as A
from schemas.config import Settings
from tests.lake.workload import (
    ALL_ASSETS,
    BASE_NS,
    MS,
    RESOURCE,
    Client,
    _SeededIds,
    collectors,
    run_assets,
    table_rows,
)

pytestmark = pytest.mark.kafka

N_ROLLOUTS = 200
AGL_LLM_SPAN = "openai.chat.completion"
AGL_REWARD_VALUE = f"{A.AGL_REWARD_PREFIX}.0.{A.AGL_REWARD_VALUE_SUFFIX}"


def agl_rollout(i: int, rng: random.Random) -> list[ReadableSpan]:
    """One rollout as Agent Lightning instruments it; the spans in the order they ended."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=RESOURCE, id_generator=_SeededIds(rng))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tp.get_tracer("agentlightning")
    t = BASE_NS + i * 1_000 * MS
    root_attrs = {A.ROLLOUT_ID: f"agl-{i:03d}", A.OI_AGENT_NAME: rng.choice(["math", "sql"])}
    root = tracer.start_span("agentlightning.rollout", start_time=t, attributes=root_attrs)
    ctx = set_span_in_context(root)
    prompt = [rng.randrange(1, 30_000) for _ in range(rng.randint(2, 6))]
    for j in range(rng.randint(2, 5)):
        t += 10 * MS
        response = [rng.randrange(1, 30_000) for _ in range(rng.randint(1, 4))]
        attrs: dict[str, Any] = {
            A.AGL_PROMPT_TOKEN_IDS: list(prompt),
            A.AGL_RESPONSE_TOKEN_IDS: response,
            A.GEN_AI_RESPONSE_ID: f"chatcmpl-agl-{i:03d}-{j}",
            A.GEN_AI_RESPONSE_MODEL: "agl-policy",
        }
        s = tracer.start_span(AGL_LLM_SPAN, context=ctx, start_time=t, attributes=attrs)
        s.end(end_time=t + 5 * MS)
        tool = tracer.start_span("tool.execute", context=ctx, start_time=t + 6 * MS, attributes={"tool.name": "run"})
        tool.end(end_time=t + 7 * MS)
        if rng.random() < 0.2:  # an intermediate annotation, right after the call
            a = tracer.start_span(
                A.AGL_REWARD_SPAN_NAME, context=ctx, start_time=t + 8 * MS, attributes={AGL_REWARD_VALUE: 0.1}
            )
            a.end(end_time=t + 9 * MS)
        prompt = prompt + response + [rng.randrange(1, 30_000)]
        t += 10 * MS
    final = rng.choice([0.0, 0.5, 1.0])
    a = tracer.start_span(A.AGL_REWARD_SPAN_NAME, context=ctx, start_time=t + MS, attributes={AGL_REWARD_VALUE: final})
    a.end(end_time=t + 2 * MS)
    root.set_status(Status(StatusCode.OK))
    root.end(end_time=t + 10 * MS)
    tp.shutdown()
    return list(exporter.get_finished_spans())


def adapter_view(spans: list[ReadableSpan]) -> dict[str, Any]:
    """Agent Lightning's reading of one trace: its rollout id (from any span), its LLM calls in start
    order, one per response id, as (prompt ids, response ids, reward) with LightningRL's reward for
    every call (the value of the last annotation), and that final reward."""
    nodes = sorted(spans, key=lambda s: s.start_time or 0)
    rid = next(s.attributes[A.ROLLOUT_ID] for s in nodes if A.ROLLOUT_ID in (s.attributes or {}))
    calls, seen = [], set()
    final = None
    for s in nodes:
        attrs = s.attributes or {}
        if s.name == AGL_LLM_SPAN and attrs.get(A.GEN_AI_RESPONSE_ID) not in seen:
            seen.add(attrs.get(A.GEN_AI_RESPONSE_ID))
            calls.append((list(attrs[A.AGL_PROMPT_TOKEN_IDS]), list(attrs[A.AGL_RESPONSE_TOKEN_IDS])))
        if s.name == A.AGL_REWARD_SPAN_NAME:
            final = attrs[AGL_REWARD_VALUE]
    return {"rollout_id": rid, "calls": [(p, r, final) for p, r in calls], "reward": final}


def export_requests(traces: list[list[ReadableSpan]], rng: random.Random) -> list[bytes]:
    """The traces as one shared exporter sends them: each trace's spans in the order they ended, cut
    into 2-3 batches (so the root, which ends last, always travels after some of its children), the
    batches of all traces interleaved and packed into requests of at most 24 spans, never two batches
    of one trace in one request."""
    queues = []
    for spans in traces:
        cuts = sorted(rng.sample(range(1, len(spans)), rng.randint(1, 2)))
        bounds = [0, *cuts, len(spans)]
        queues.append([spans[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
    requests: list[list[ReadableSpan]] = []
    current: list[ReadableSpan] = []
    in_current: set[int] = set()
    live = list(range(len(queues)))
    while live:
        i = rng.choice(live[:8])  # a few rollouts run at once, the older ones finish first
        batch = queues[i].pop(0)
        if not queues[i]:
            live.remove(i)
        if current and (i in in_current or len(current) + len(batch) > 24):
            requests.append(current)
            current, in_current = [], set()
        current = current + batch
        in_current.add(i)
    if current:
        requests.append(current)
    # by construction: every trace in 2 or 3 requests, its root in the last of them
    where: dict[int, list[int]] = {}
    for n, req in enumerate(requests):
        for trace in {s.context.trace_id for s in req}:
            where.setdefault(trace, []).append(n)
    assert len(where) == len(traces) and all(len(ns) >= 2 for ns in where.values())
    for spans in traces:
        root = next(s for s in spans if s.parent is None)
        first = min(n for n, req in enumerate(requests) if any(s is root for s in req))
        assert first == max(where[root.context.trace_id])
    return [encode_spans(r).SerializeToString() for r in requests]


@pytest.mark.slow  # Agent Lightning rollouts split over many requests, through to transitions: ~6 s
def test_agent_lightning_rollouts_split_over_requests_stay_whole(settings: Settings, tmp_path: Path) -> None:
    rng = random.Random(14)
    traces = [agl_rollout(i, rng) for i in range(N_ROLLOUTS)]
    expected = {v["rollout_id"]: v for v in map(adapter_view, traces)}
    assert len(expected) == N_ROLLOUTS
    bodies = export_requests(traces, rng)

    client = Client()
    try:
        with collectors(settings, 2, log_dir=tmp_path) as ports:
            for n, body in enumerate(bodies):
                client.traces(ports[n % 2], body)
                if n in (len(bodies) // 3, 2 * len(bodies) // 3):  # ingestion runs while rollouts arrive
                    run_assets(settings, ALL_ASSETS)
    finally:
        client.close()
    run_assets(settings, ALL_ASSETS)

    lake = Path(settings.lake.root)
    traj = table_rows(str(lake / "trajectories"), ["rollout_id", "attempt_id"])
    trans = table_rows(str(lake / "transitions"), ["transition_id"])
    got: dict[str, dict[str, Any]] = {}
    for (rid, _), row in traj.items():
        got[str(rid)] = {"rollout_id": rid, "calls": [], "reward": row["final_reward"]}
    for row in sorted(trans.values(), key=lambda r: (r["rollout_id"], r["step"])):
        entry = got.setdefault(row["rollout_id"], {"rollout_id": row["rollout_id"], "calls": [], "reward": None})
        entry["calls"].append((row["prompt_ids"], row["response_ids"], row["reward"]))

    right = [rid for rid, want in expected.items() if got.get(rid) == want]
    wrong = [rid for rid in expected if rid not in right]
    extra = sorted(set(got) - set(expected))
    lines = [f"{len(right)} of {N_ROLLOUTS} rollouts identical to Agent Lightning's reading"]
    for rid in wrong[:3]:
        want, have = expected[rid], got.get(rid)
        seen = "no rollout" if have is None else f"{len(have['calls'])} transitions, final reward {have['reward']}"
        lines.append(f"  {rid}: want {len(want['calls'])} transitions, final reward {want['reward']}; got {seen}")
    if extra:
        lines.append(f"  {len(extra)} rollouts Agent Lightning does not know (named by trace id), e.g.:")
        for rid in extra[:3]:
            row = next(r for (k, _), r in traj.items() if k == rid) if any(k == rid for k, _ in traj) else {}
            lines.append(
                f"    {rid}: status {row.get('status')}, {row.get('n_llm_calls')} LLM calls, "
                f"final reward {got[rid]['reward']}, {len(got[rid]['calls'])} transitions"
            )
    assert len(right) == N_ROLLOUTS and not extra, "\n".join(lines)
