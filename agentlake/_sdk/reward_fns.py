"""Lake-side reward functions: ``@reward_fn(name=..., version=...)`` over a finished trajectory.

Unlike ``agentlake.reward`` (which an agent calls while it runs, and which emits a span), these run
in the pipeline, after the fact, over what the lake recorded: the `reward_functions` asset imports
the modules named in ``[credit] reward_modules`` (`pipelines/silver/reward_functions.py`) and scores
every finished trajectory with each function found there. The name and version are the reward's
identity in `rewards` (source ``fn:<name>@<version>``): bump the version when the function's meaning changes and every
trajectory is scored again; keep it and only new trajectories are.

    from agentlake import Trajectory, reward_fn

    @reward_fn(name="exact_answer", version="2")
    def exact_answer(t: Trajectory) -> float | None:
        return float(t.answer.strip() == "42") if t.answer is not None else None

Importing this module imports nothing heavy (no Polars, no Dagster).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentlake._sdk.tracing import SdkError
from schemas.messages import parse_messages

_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")


@dataclass(frozen=True)
class Trajectory:
    """One attempt of a rollout as the `trajectories` table holds it, read-only."""

    tenant: str
    rollout_id: str
    attempt_id: str | None
    task_id: str | None
    status: str
    agents: tuple[str, ...] = ()
    calls: tuple[Mapping[str, Any], ...] = ()  # LLM calls in order (messages are JSON text)
    rewards: tuple[Mapping[str, Any], ...] = ()  # rewards already attached (spans, events)
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    trace_ids: tuple[str, ...] = ()
    spans: tuple[Mapping[str, Any], ...] = ()  # its spans in start order: name, ids, times, status, attributes
    extra: Mapping[str, Any] = field(default_factory=dict)  # the rest of the row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Trajectory:
        """A view of one `trajectories` row (a dict of its columns)."""
        known = {"tenant", "rollout_id", "attempt_id", "task_id", "status", "agents", "calls", "rewards"}
        known |= {"start_time", "end_time", "trace_ids", "spans"}
        return cls(
            tenant=row["tenant"],
            rollout_id=row["rollout_id"],
            attempt_id=row.get("attempt_id"),
            task_id=row.get("task_id"),
            status=row["status"],
            agents=tuple(row.get("agents") or ()),
            calls=tuple(row.get("calls") or ()),
            rewards=tuple(row.get("rewards") or ()),
            start_time=row.get("start_time"),
            end_time=row.get("end_time"),
            trace_ids=tuple(row.get("trace_ids") or ()),
            spans=tuple({**sp, "attributes": _object(sp.get("attributes"))} for sp in row.get("spans") or ()),
            extra={k: v for k, v in row.items() if k not in known},
        )

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation: the last call's input messages (tool results included) and its output."""
        if not self.calls:
            return []
        last = self.calls[-1]
        return parse_messages(last.get("input_messages")) + parse_messages(last.get("output_messages"))

    @property
    def tool_results(self) -> list[dict[str, Any]]:
        """The ``role: tool`` messages the model was shown."""
        return [m for m in self.messages if m.get("role") == "tool"]

    @property
    def answer(self) -> str | None:
        """The text of the last model output, or None when there is none."""
        outputs = [m for m in self.messages if m.get("role") == "assistant"]
        content = outputs[-1].get("content") if outputs else None
        if isinstance(content, list):  # content parts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        return content if isinstance(content, str) else None


def _object(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


RewardCallable = Callable[[Trajectory], "float | None"]


@dataclass(frozen=True)
class RewardFn:
    """A registered reward function: its identity (name, version) and the function itself."""

    name: str
    version: str
    fn: RewardCallable

    @property
    def source(self) -> str:
        """What `rewards.source` says for its rows."""
        return f"fn:{self.name}@{self.version}"

    def __call__(self, trajectory: Trajectory) -> float | None:
        return self.fn(trajectory)

    def score(self, row: Mapping[str, Any]) -> float | None:
        """Score one `trajectories` row (what the pipeline calls: it does not import this package)."""
        return self.fn(Trajectory.from_row(row))


def reward_fn(*, name: str, version: str = "1") -> Callable[[RewardCallable], RewardFn]:
    """Declare a lake-side reward function ``(Trajectory) -> float | None`` (None: no reward)."""
    for what, value in (("name", name), ("version", version)):
        if not isinstance(value, str) or not _NAME.match(value):
            raise SdkError(f"reward_fn: {what} must be letters, digits or _.:- (got {value!r})")

    def wrap(fn: RewardCallable) -> RewardFn:
        return RewardFn(name=name, version=version, fn=fn)

    return wrap
