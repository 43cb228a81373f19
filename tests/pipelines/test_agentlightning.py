"""Spans written the way Agent Lightning writes them give LightningRL's transitions.

The reference below follows Agent Lightning's TracerTraceToTriplet (LLM calls matched by span name
``openai.chat.completion``, deduplicated by response id, rewards from ``agentlightning.annotation``
spans matched FIRST_OCCURRENCE) and LightningRL (every call of a rollout gets the final reward).
"""

from __future__ import annotations

import re

import polars as pl
import pytest
from opentelemetry.sdk.trace import ReadableSpan

from pipelines.gold.transitions import build
from schemas import attributes as A
from schemas.config import CreditSettings, Settings
from tests.pipelines.otel import Call, Rollout, make_spans, produce, span_record
from tests.pipelines.test_flow import lake_of, run, table

pytestmark = pytest.mark.kafka


def lightning_rl(spans: list[ReadableSpan]) -> list[tuple[list[int], list[int], float | None, float | None]]:
    """(prompt ids, response ids, first-occurrence reward, LightningRL reward) per LLM call."""
    nodes = sorted(spans, key=lambda s: s.start_time or 0)
    calls, seen_ids = [], set()
    for s in nodes:
        if re.search(r"openai\.chat\.completion", s.name):
            rid = (s.attributes or {}).get(A.GEN_AI_RESPONSE_ID)
            if rid in seen_ids:
                continue
            seen_ids.add(rid)
            calls.append(s)
    matched: dict[int, float] = {}
    passed = []
    final = None
    for item in nodes:
        if item in calls:
            passed.append(item)
        if item.name == A.AGL_REWARD_SPAN_NAME:
            value = (item.attributes or {})[f"{A.AGL_REWARD_PREFIX}.0.{A.AGL_REWARD_VALUE_SUFFIX}"]
            final = value
            for c in reversed(passed):
                if (c.end_time or 0) > (item.start_time or 0) or c.context.span_id in matched:
                    continue
                matched[c.context.span_id] = value
                break
    return [
        (
            list(c.attributes[A.AGL_PROMPT_TOKEN_IDS]),
            list(c.attributes[A.AGL_RESPONSE_TOKEN_IDS]),
            matched.get(c.context.span_id),
            final,
        )
        for c in calls
    ]


def test_agent_lightning_spans_give_lightningrl_transitions(settings: Settings) -> None:
    calls = [
        Call(prompt=[5, 6], response=[7, 8, 9], reward_after=0.3),
        Call(prompt=[5, 6, 7, 8, 9, 1], response=[2], response_id="chatcmpl-2"),
        Call(prompt=[5, 6, 7, 8, 9, 1, 2, 3], response=[4, 4]),
    ]
    rollout = Rollout("agl-1", attempt_id="at-1", calls=calls, final_reward=1.0, style="agentlightning", agent="math")
    spans = make_spans(rollout)
    # the same call reported twice (an LLM proxy span and a client span): one transition
    dup = make_spans(Rollout("agl-1", attempt_id="at-1", calls=[calls[1]], style="agentlightning", end_root=False))
    expected = lightning_rl(spans)
    assert [e[2] for e in expected] == [0.3, None, 1.0]  # first-occurrence matching
    produce(settings.kafka, settings.kafka.spans_topic, [span_record(spans, key="agl-1")])
    run(settings)

    traj = table(lake_of(settings), "trajectories")
    assert traj["rollout_id"].to_list() == ["agl-1"] and traj["attempt_id"].to_list() == ["at-1"]
    assert traj["final_reward"].to_list() == [1.0] and traj["agents"].to_list() == [["math"]]
    tr = table(lake_of(settings), "transitions").sort("step")
    assert [
        (p.to_list(), r.to_list(), rew)
        for p, r, rew in zip(tr["prompt_ids"], tr["response_ids"], tr["reward"], strict=True)
    ] == [(e[0], e[1], e[3]) for e in expected]
    assert set(tr["agent_name"]) == {"math"}

    # per-step credit uses exactly the first-occurrence matches
    per_step = build(traj, CreditSettings(mode="per_step", gamma=1.0, advantage="none"), now=traj["updated_at"][0])
    got = pl.from_arrow(per_step.table).sort("step")
    assert got["reward"].to_list() == pytest.approx([e[2] or 0.0 for e in expected])

    # a duplicate report of call 1 (same response id) does not add a transition
    dup_ids = [s for s in dup if s.name == "openai.chat.completion"]
    assert dup_ids
    produce(settings.kafka, settings.kafka.spans_topic, [span_record(dup_ids, key="agl-1")])
    run(settings)
    again = table(lake_of(settings), "trajectories")
    assert again["n_spans"].to_list() == [traj["n_spans"][0] + 1] and again["n_llm_calls"].to_list() == [3]
    assert table(lake_of(settings), "transitions").height == 3
