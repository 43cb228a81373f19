"""One rollout: its trajectory row, span tree, LLM calls, transitions (main table and each credit
variant), rewards by source, judgements and the model versions that trained on it.

Every query is limited to the visitor's ``Scope`` and takes its values as DuckDB parameters; the only
names in the SQL are the fixed tables and the credit variants found in the lake (``ViewerLake.variants``).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from pipelines.gold.retokenize import normalize
from viewer.auth import Scope
from viewer.lake import ViewerLake, known_table
from viewer.queries.tokens import TokenText


@dataclass
class SpanNode:
    """A span with its children, and where it sits in the rollout's time (ms from the rollout's start)."""

    span: dict[str, Any]
    offset_ms: float
    duration_ms: float | None
    children: list[SpanNode] = field(default_factory=list)


@dataclass(frozen=True)
class Token:
    text: str
    trained: bool
    logprob: float | None


@dataclass
class TransitionView:
    row: dict[str, Any]
    tokens: list[Token]
    prompt_text: str
    trained_in: list[str]  # model versions whose training read this transition


@dataclass
class CallView:
    call: dict[str, Any]
    messages: list[dict[str, Any]]  # the input messages, then the output ones (normalized OpenAI shape)
    n_input: int
    tools: Any
    token_source: str  # "exact" (the engine's ids came with the span) or "retokenized"
    token_status: str | None  # the transition's (exact, verified, unverified, mismatch), when one was built


@dataclass
class RolloutView:
    trajectory: dict[str, Any]
    attempts: list[dict[str, Any]]  # (tenant, attempt_id) of every row under this rollout id in scope
    spans: list[SpanNode]
    calls: list[CallView]
    rewards: list[dict[str, Any]]
    judgements: list[dict[str, Any]]
    variants: dict[str, list[TransitionView]]  # "transitions" first, then transitions__<variant>

    @property
    def total_ms(self) -> float:
        """The span tree's extent (ms from the rollout's start to the last span's end), for the timing bars."""

        def end(n: SpanNode) -> float:
            return max([n.offset_ms + (n.duration_ms or 0.0), *(end(c) for c in n.children)])

        return max([1.0, *(end(n) for n in self.spans)])


def _same_attempt(column: str = "attempt_id") -> str:
    return f"{column} IS NOT DISTINCT FROM ?"


def find_trajectory(
    lake: ViewerLake, scope: Scope, rollout_id: str, *, tenant: str | None = None, attempt: str | None = None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The rollout's chosen row (``tenant``/``attempt`` when given, else the latest updated) and all rows'
    (tenant, attempt_id) under this id in scope; (None, []) when the rollout is not there."""
    tenant_sql, params = scope.tenant_filter("tenant")
    # the keys first (small columns), then the one whole row from its day's partition only
    keys = lake.frame(
        f"SELECT tenant, attempt_id, day FROM trajectories WHERE rollout_id = ? AND {tenant_sql} "
        "ORDER BY updated_at DESC, tenant, attempt_id NULLS FIRST",
        [rollout_id, *params],
    ).to_dicts()
    attempts = [{"tenant": r["tenant"], "attempt_id": r["attempt_id"]} for r in keys]
    chosen = [
        r for r in keys if (tenant is None or r["tenant"] == tenant) and (attempt is None or r["attempt_id"] == attempt)
    ]
    if not chosen:
        return None, attempts
    key = chosen[0]
    rows = lake.frame(
        f"SELECT * FROM trajectories WHERE day = ? AND tenant = ? AND rollout_id = ? AND {_same_attempt()} "
        "ORDER BY updated_at DESC LIMIT 1",
        [key["day"], key["tenant"], rollout_id, key["attempt_id"]],
    ).to_dicts()
    return (rows[0] if rows else None), attempts


def span_tree(lake: ViewerLake, trajectory: dict[str, Any]) -> list[SpanNode]:
    """The spans of the rollout's traces as a forest ordered by start time (orphans become roots)."""
    trace_ids = [t for t in trajectory.get("trace_ids") or [] if t]
    if not trace_ids:
        return []
    start: dt.datetime | None = trajectory.get("start_time")
    end: dt.datetime | None = trajectory.get("end_time") or start
    day_sql, day_params = "", []
    if start is not None and end is not None:
        # the day partition around the rollout, so DuckDB reads only those days' files
        day_sql = " AND day BETWEEN ?::DATE AND ?::DATE"
        day_params = [(start - dt.timedelta(days=1)).date(), (end + dt.timedelta(days=1)).date()]
    spans = lake.frame(
        "SELECT trace_id, span_id, parent_span_id, name, kind, start_time, end_time, status_code, status_message, "
        "agent_name, llm_response_id, llm_model, reward_name, reward_value FROM spans "
        f"WHERE tenant = ? AND list_contains(?, trace_id){day_sql} "
        "ORDER BY start_time, span_id",
        [trajectory["tenant"], trace_ids, *day_params],
    ).to_dicts()
    if not spans:
        return []
    t0 = start or min(s["start_time"] for s in spans)
    nodes: dict[tuple[str, str], SpanNode] = {}
    for s in spans:
        duration = (s["end_time"] - s["start_time"]).total_seconds() * 1000 if s["end_time"] else None
        nodes[(s["trace_id"], s["span_id"])] = SpanNode(s, (s["start_time"] - t0).total_seconds() * 1000, duration)
    roots: list[SpanNode] = []
    for s in spans:
        node = nodes[(s["trace_id"], s["span_id"])]
        parent = nodes.get((s["trace_id"], s["parent_span_id"] or ""))
        (parent.children if parent is not None and parent is not node else roots).append(node)
    return roots


def _messages(raw: Any) -> list[dict[str, Any]]:  # noqa: ANN401 - JSON text as stored
    try:
        return normalize(raw)
    except (ValueError, TypeError):
        return [{"role": "unparsed", "content": str(raw)}]


def _json(raw: Any) -> Any:  # noqa: ANN401 - JSON text as stored
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def transitions(lake: ViewerLake, table: str, trajectory: dict[str, Any], tokens: TokenText) -> list[TransitionView]:
    """The rollout attempt's rows of ``table`` (``transitions`` or a variant) in step order, tokens decoded."""
    name = known_table(table, lake)
    # a transition's day is its trajectory's: the partition filter lets DuckDB read that day's files only
    rows = lake.frame(
        f"SELECT * FROM {name} WHERE day = ? AND tenant = ? AND rollout_id = ? AND {_same_attempt()} ORDER BY step",
        [trajectory["day"], trajectory["tenant"], trajectory["rollout_id"], trajectory["attempt_id"]],
    ).to_dicts()
    trained = _trained_in(lake, [r["transition_id"] for r in rows])
    out = []
    for r in rows:
        ids = list(r.get("response_ids") or [])
        mask = list(r.get("loss_mask") or [])
        logprobs = list(r.get("response_logprobs") or [])
        pieces = tokens.pieces(ids)
        toks = [
            Token(
                text=pieces[i],
                trained=bool(mask[i]) if i < len(mask) else False,
                logprob=float(logprobs[i]) if i < len(logprobs) and logprobs[i] is not None else None,
            )
            for i in range(len(ids))
        ]
        out.append(
            TransitionView(r, toks, tokens.text(list(r.get("prompt_ids") or [])), trained.get(r["transition_id"], []))
        )
    return out


def _trained_in(lake: ViewerLake, transition_ids: list[str]) -> dict[str, list[str]]:
    """transition id -> the model versions whose training read it (training_lineage)."""
    if not transition_ids:
        return {}
    rows = lake.frame(
        "SELECT transition_id, list(DISTINCT model_version ORDER BY model_version) AS versions "
        "FROM training_lineage WHERE list_contains(?, transition_id) GROUP BY transition_id",
        [transition_ids],
    )
    return {r["transition_id"]: list(r["versions"]) for r in rows.to_dicts()}


def calls(trajectory: dict[str, Any], main: list[TransitionView]) -> list[CallView]:
    """The trajectory's LLM calls with their messages and how their tokens are known."""
    status_by_step = {t.row["step"]: t.row.get("token_status") for t in main}
    out = []
    for c in trajectory.get("calls") or []:
        inputs, outputs = _messages(c.get("input_messages")), _messages(c.get("output_messages"))
        exact = bool(c.get("completion_token_ids"))
        out.append(
            CallView(
                call=c,
                messages=[*inputs, *outputs],
                n_input=len(inputs),
                tools=_json(c.get("tools")),
                token_source="exact" if exact else "retokenized",
                token_status=status_by_step.get(c.get("step")),
            )
        )
    return out


def judgements(lake: ViewerLake, trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """What the LLM judge said about this rollout attempt (its score, rank reward and words), newest first."""
    return lake.frame(
        "SELECT source, status, score, reward, reason, model, position, members, calls, created_at "
        f"FROM judgements WHERE tenant = ? AND rollout_id = ? AND {_same_attempt()} ORDER BY created_at DESC, source",
        [trajectory["tenant"], trajectory["rollout_id"], trajectory["attempt_id"]],
    ).to_dicts()


def rewards(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """Every reward the rollout got (spans, /v1/rewards events, reward functions), by source then time."""
    rows = [dict(r) for r in trajectory.get("rewards") or []]
    return sorted(rows, key=lambda r: (str(r.get("source")), str(r.get("event_time")), str(r.get("name"))))


def rollout_view(
    lake: ViewerLake,
    scope: Scope,
    rollout_id: str,
    tokens: TokenText,
    *,
    tenant: str | None = None,
    attempt: str | None = None,
) -> RolloutView | None:
    """Everything the rollout page shows, or None when the rollout is not in ``scope``."""
    trajectory, attempts = find_trajectory(lake, scope, rollout_id, tenant=tenant, attempt=attempt)
    if trajectory is None:
        return None
    variants = {"transitions": transitions(lake, "transitions", trajectory, tokens)}
    for v in lake.variants():
        variants[f"transitions__{v}"] = transitions(lake, f"transitions__{v}", trajectory, tokens)
    return RolloutView(
        trajectory=trajectory,
        attempts=attempts,
        spans=span_tree(lake, trajectory),
        calls=calls(trajectory, variants["transitions"]),
        rewards=rewards(trajectory),
        judgements=judgements(lake, trajectory),
        variants=variants,
    )
