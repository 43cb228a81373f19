"""The running baseline: state carried from run to run for single-sample production traffic.

One baseline per (tenant, agent), an EMA of real rewards counted in the order they became known;
saved in the `transitions` commit metadata (``agentlake.running_baseline``). The estimator that
reads it is ``running_baseline`` in `pipelines.gold.estimators`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from schemas.topics import DEFAULT_TENANT

BASELINE_DECAY = 0.9  # running baseline: after ~10 samples, an EMA with this decay


@dataclass
class RunningBaseline:
    """State of the running baseline, carried from one run to the next in Delta commit metadata."""

    value: float = 0.0
    count: int = 0

    def peek(self) -> float:
        """The baseline a score would be compared with now (0 before any)."""
        return self.value if self.count else 0.0

    def advance(self, score: float) -> float:
        """Return the baseline for ``score`` (before seeing it), then update."""
        before = self.peek()
        self.count += 1
        rate = max(1.0 / self.count, 1.0 - BASELINE_DECAY)
        self.value = self.value + rate * (score - self.value) if self.count > 1 else score
        return before

    def to_json(self) -> str:
        return json.dumps({"value": self.value, "count": self.count})

    @classmethod
    def from_json(cls, text: str | None) -> RunningBaseline:
        if not text:
            return cls()
        d = json.loads(text)
        return cls(float(d["value"]), int(d["count"]))


@dataclass
class TenantBaselines:
    """One running baseline per (tenant, agent): one tenant's rewards never move another's
    advantages, and agents of one tenant, whose rewards differ in scale, are not compared with each other.

    Saved as the single baseline was (``value``, ``count``: the default tenant's rollouts without an
    agent name), the other tenants' agent-less baselines under ``tenants`` and the agents' under
    ``agents`` (tenant -> agent -> state): a lake from before keeps its baseline, which goes on
    serving rollouts without an agent; each agent's starts empty.
    """

    by_tenant: dict[str, RunningBaseline] = field(default_factory=dict)
    by_agent: dict[tuple[str, str], RunningBaseline] = field(default_factory=dict)

    def of(self, tenant: str, agent: str | None = None) -> RunningBaseline:
        """The baseline of ``agent`` in ``tenant`` (without an agent: the tenant's), started empty when new."""
        if agent is None:
            return self.by_tenant.setdefault(tenant, RunningBaseline())
        return self.by_agent.setdefault((tenant, agent), RunningBaseline())

    def peek(self, tenant: str, agent: str | None = None) -> float:
        """What a score of ``agent`` in ``tenant`` would be compared with now; records nothing."""
        found = self.by_tenant.get(tenant) if agent is None else self.by_agent.get((tenant, agent))
        return found.peek() if found is not None else 0.0

    def to_json(self) -> str:
        default = self.by_tenant.get(DEFAULT_TENANT, RunningBaseline())
        out: dict[str, object] = {"value": default.value, "count": default.count}
        others = {t: {"value": b.value, "count": b.count} for t, b in sorted(self.by_tenant.items())}
        others.pop(DEFAULT_TENANT, None)
        if others:
            out["tenants"] = others
        agents: dict[str, dict[str, dict[str, float | int]]] = {}
        for (tenant, agent), b in sorted(self.by_agent.items()):
            agents.setdefault(tenant, {})[agent] = {"value": b.value, "count": b.count}
        if agents:
            out["agents"] = agents
        return json.dumps(out)

    @classmethod
    def from_json(cls, text: str | None) -> TenantBaselines:
        if not text:
            return cls()
        d = json.loads(text)
        out = cls()
        if int(d.get("count", 0)):
            out.by_tenant[DEFAULT_TENANT] = RunningBaseline(float(d["value"]), int(d["count"]))
        for tenant, b in (d.get("tenants") or {}).items():
            out.by_tenant[tenant] = RunningBaseline(float(b["value"]), int(b["count"]))
        for tenant, agents in (d.get("agents") or {}).items():
            for agent, b in agents.items():
                out.by_agent[(tenant, agent)] = RunningBaseline(float(b["value"]), int(b["count"]))
        return out


def compare_running(
    state: RunningBaseline | TenantBaselines,
    tenant: str,
    agent: str | None,
    score: float,
    *,
    default: bool,
) -> float:
    """The baseline ``score`` is compared with; a real score then advances it, a default one does not."""
    if isinstance(state, TenantBaselines):
        return state.peek(tenant, agent) if default else state.of(tenant, agent).advance(score)
    return state.peek() if default else state.advance(score)
