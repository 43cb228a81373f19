"""Generated agent workloads for the lake's differential tests, the reference they are checked
against, and the harness that pushes them through the real services.

Three parts, kept apart on purpose:

* **The generator** (hypothesis strategies): rollouts of 1-6 LLM calls by several agents on a few
  tasks, each call with exact token ids (+ logprobs) or messages only, the rollout's identity
  (``agentlake.rollout.id``, attempt, task, agent) on the root span only or on every span, reward
  spans, late reward events, and a delivery schedule: each trace cut into export requests in the
  order the OTel ``BatchSpanProcessor`` sends them (spans as they end, so children before their
  root), requests of several traces mixed, resent requests (client retries), late rewards, asset
  runs in random increments, the maintenance job and a broker restart, all interleaved.
  A second tenant (its own bearer token) runs rollouts that reuse the first tenant's ids: rollout
  ids (so response ids and late-reward event ids too), attempt ids, task ids, and for some the very
  trace id and span ids; nothing of one tenant may merge with, match or re-score the other's.
  Spans are made by the real OTel SDK (seeded ids) and encoded as the OTLP exporter encodes them.
* **The reference**: the `trajectories` and `transitions` rows the lake must hold, computed from
  the generated ground truth alone. It imports nothing from ``pipelines``; its rules are the design's
  (DESIGN.md, "Identity of a rollout" and "Credit assignment"), spelled out in ``reference``.
* **The harness**: a broker that survives a restart (Tansu with its log on a local SeaweedFS S3),
  collectors on free ports, an OTLP/HTTP client that retries like an exporter, asset runs through
  ``dagster.materialize``, and a row-for-row comparison that names the first differing rows.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Status, StatusCode, set_span_in_context

from agentlake.stack.broker import DurableBroker as DurableBroker  # the product's, restartable
from agentlake.stack.objectstore import weed_binary as weed_binary
from schemas import attributes as A

MS = 1_000_000  # ns
S = 1_000 * MS
BASE_NS = int(dt.datetime(2025, 6, 15, 12, 0, tzinfo=dt.UTC).timestamp()) * S
TENANT = "default"  # the first tenant's: its rows are exactly what they were before tenants were keys
TENANT_B = "team-b"  # the second tenant, which reuses the first one's ids
TOKENS = {"token-default": TENANT, "token-b": TENANT_B}  # collector.auth_tokens: bearer token -> tenant
MODEL = "agentlake-policy"
AGENTS = ("planner", "solver", "critic")
STD_EPS = 1e-6  # GRPO: (R - mean) / (std + eps), DESIGN.md "Credit assignment"


def token_of(tenant: str) -> str:
    """The bearer token a tenant's agents send (``TOKENS``)."""
    return next(token for token, t in TOKENS.items() if t == tenant)


# --- a word-level tokenizer with a chat template, for calls that recorded messages only -----------
CONTENT_WORDS = ("what", "is", "two", "plus", "three", "four", "the", "sum", "answer", "calc", "ok", "no")
VOCAB = ("<unk>", "<eos>", "<system>", "<user>", "<assistant>", *CONTENT_WORDS)
TOKEN = {w: i for i, w in enumerate(VOCAB)}
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def build_tokenizer_dir(path: Path) -> Path:
    """Save the word-level tokenizer (``VOCAB``, ``CHAT_TEMPLATE``) as a Hugging Face folder."""
    import tokenizers
    import transformers

    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(dict(TOKEN), unk_token="<unk>"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(path)
    return path


def template_tokens(
    messages_in: list[dict[str, str]], messages_out: list[dict[str, str]]
) -> tuple[list[int], list[int]]:
    """What the policy saw and wrote, by ``CHAT_TEMPLATE`` rendered by hand (no tokenizer library).

    The prompt is the input turns plus the generation prompt ``<assistant>``; the response is what
    the full conversation adds after it (the first output turn's role token is the generation prompt).
    """

    def turn(m: dict[str, str]) -> list[int]:
        return [TOKEN[f"<{m['role']}>"], *(TOKEN[w] for w in m["content"].split()), TOKEN["<eos>"]]

    prompt = [t for m in messages_in for t in turn(m)] + [TOKEN["<assistant>"]]
    assert messages_out and messages_out[0]["role"] == "assistant"
    full_out = [t for m in messages_out for t in turn(m)]
    return prompt, full_out[1:]


# --- the ground truth ---------------------------------------------------------------------------------


@dataclass
class CallSpec:
    """One LLM call. ``prompt``/``response`` None: the call recorded messages only."""

    agent: str | None
    prompt: list[int] | None
    response: list[int] | None
    logprobs: list[float] | None
    messages_in: list[dict[str, str]] | None
    messages_out: list[dict[str, str]] | None
    policy_version: str
    tool: bool  # a tool span follows the call (noise: not an LLM call)
    policy_sha256: str | None = None  # the served adapter's manifest hash, as the gateway records it
    # set when the spans are made
    span_id: str = ""
    response_id: str = ""
    start_ns: int = 0
    end_ns: int = 0

    @property
    def kind(self) -> str:
        if self.prompt is None:
            return "msg"
        return "ids+msg" if self.messages_in is not None else "ids"


@dataclass
class RewardSpanSpec:
    """An ``agentlake.reward`` span, after call ``after_call`` (-1: at the end of the rollout)."""

    value: float
    name: str | None  # None: unnamed, which is the primary reward
    after_call: int
    span_id: str = ""
    start_ns: int = 0


@dataclass
class LateReward:
    """A reward event posted to the collector's ``/v1/rewards`` after the rollout ended."""

    value: float
    by: str  # "rollout" | "trace" | "response": what the event names
    call: int  # the call whose response id it names (by == "response")
    event_id: str = ""
    ts_ns: int = 0

    def body(self, r: RolloutSpec) -> dict[str, Any]:
        event: dict[str, Any] = {"value": self.value, "event_id": self.event_id, "timestamp": iso(self.ts_ns)}
        if self.by == "rollout":
            event["rollout_id"] = r.rollout_id
        elif self.by == "trace":
            event["trace_id"] = r.trace_id
        else:
            event["response_id"] = r.calls[self.call].response_id
        return event


@dataclass
class RolloutSpec:
    index: int
    rollout_id: str
    attempt_id: str | None
    task_id: str | None
    agent: str
    ids_on: str  # "root": identity on the root span only; "every": on every span
    failed: bool
    calls: list[CallSpec]
    rewards: list[RewardSpanSpec]
    late: list[LateReward]
    tenant: str = TENANT
    twin_of: int | None = None  # a rollout of the other tenant whose trace and span ids this one reuses
    # set when the spans are made
    trace_id: str = ""
    start_ns: int = 0
    end_ns: int = 0
    spans: list[ReadableSpan] = field(default_factory=list, repr=False)  # in the order they ended
    chunks: list[list[ReadableSpan]] = field(default_factory=list, repr=False)  # export batches

    def short(self) -> str:
        kinds = ",".join(c.kind for c in self.calls)
        rewards = ",".join(f"{r.name or 'primary'}={r.value}@{r.after_call}" for r in self.rewards)
        late = ",".join(f"{x.by}={x.value}" for x in self.late)
        cuts = "+".join(str(len(c)) for c in self.chunks)
        twin = "" if self.twin_of is None else f", ids of #{self.twin_of}"
        return (
            f"{self.tenant}:{self.rollout_id}(task={self.task_id}, attempt={self.attempt_id}{twin}, "
            f"ids_on={self.ids_on}, "
            f"failed={self.failed}, calls=[{kinds}], rewards=[{rewards}], late=[{late}], batches={cuts})"
        )


@dataclass(frozen=True)
class Send:
    """POST one export request (``request`` indexes ``Workload.requests``) to collector ``collector``."""

    request: int
    collector: int
    resend: bool = False


@dataclass(frozen=True)
class PostReward:
    rollout: int
    reward: int
    collector: int
    resend: bool = False


@dataclass(frozen=True)
class Run:
    """Materialize these assets (a random increment of the asset graph)."""

    assets: tuple[str, ...]


@dataclass(frozen=True)
class Maintain:
    """The nightly maintenance job (compaction and vacuum of every table), or with ``recent`` the hourly
    compaction of the newest day partitions (`compact_recent_job`)."""

    recent: bool = False


@dataclass(frozen=True)
class Restart:
    """Kill the broker (SIGKILL) and start it again on the same port and log."""


Step = Send | PostReward | Run | Maintain | Restart

ASSET_INCREMENTS: tuple[tuple[str, ...], ...] = (
    ("spans",),
    ("spans", "rewards"),
    ("spans", "rewards", "trajectories"),
    ("spans", "rewards", "trajectories", "transitions"),
    ("rewards", "trajectories"),
    ("trajectories", "transitions"),
    ("transitions",),
)
ALL_ASSETS = ("spans", "rewards", "trajectories", "transitions")


@dataclass
class Workload:
    rollouts: list[RolloutSpec]
    requests: list[list[tuple[int, int]]]  # each request: (rollout, chunk) parts
    schedule: list[Step]

    def request_body(self, i: int) -> bytes:
        """The request as the OTLP/HTTP exporter sends it: one ``ExportTraceServiceRequest``."""
        spans = [s for r, c in self.requests[i] for s in self.rollouts[r].chunks[c]]
        return encode_spans(spans).SerializeToString()

    def request_token(self, i: int) -> str:
        """The bearer token the request is sent with: its tenant's (a request holds one tenant's spans)."""
        return token_of(self.rollouts[self.requests[i][0][0]].tenant)

    def __repr__(self) -> str:
        def step(s: Step) -> str:
            if isinstance(s, Send):
                parts = " ".join(
                    f"{self.rollouts[r].tenant}:{self.rollouts[r].rollout_id}#{c}" for r, c in self.requests[s.request]
                )
                return f"{'re' if s.resend else ''}send[{parts}]->c{s.collector}"
            if isinstance(s, PostReward):
                rid = f"{self.rollouts[s.rollout].tenant}:{self.rollouts[s.rollout].rollout_id}"
                return f"{'re' if s.resend else ''}reward[{rid}.{s.reward}]->c{s.collector}"
            if isinstance(s, Run):
                return "run(" + "+".join(s.assets) + ")"
            return type(s).__name__.lower()

        lines = ["Workload("] + [f"  {r.short()}" for r in self.rollouts]
        lines.append("  schedule: " + ", ".join(step(s) for s in self.schedule))
        return "\n".join(lines) + ")"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # how hypothesis prints a failing example
        p.text(repr(self))


# --- the generator --------------------------------------------------------------------------------------

_rewards = st.integers(-4, 8).map(lambda v: v / 8)
_logprob = st.integers(-5000, 0).map(lambda v: v / 1000)
_words = st.lists(st.sampled_from(CONTENT_WORDS), min_size=1, max_size=4).map(" ".join)


@st.composite
def call_specs(draw: st.DrawFn, messages: bool) -> CallSpec:
    kinds = ["ids", "ids", "ids+msg", "msg"] if messages else ["ids"]
    kind = draw(st.sampled_from(kinds))
    prompt = response = logprobs = None
    if kind != "msg":
        prompt = draw(st.lists(st.integers(0, 60_000), min_size=1, max_size=8))
        response = draw(st.lists(st.integers(0, 60_000), min_size=1, max_size=6))
        if draw(st.sampled_from([True, True, True, False])):
            logprobs = draw(st.lists(_logprob, min_size=len(response), max_size=len(response)))
    m_in = m_out = None
    if kind != "ids":
        m_in = [{"role": "user", "content": draw(_words)}]
        if draw(st.booleans()):
            m_in.insert(0, {"role": "system", "content": draw(_words)})
        m_out = [{"role": "assistant", "content": draw(_words)}]
    return CallSpec(
        agent=draw(st.sampled_from([None, None, *AGENTS])),
        prompt=prompt,
        response=response,
        logprobs=logprobs,
        messages_in=m_in,
        messages_out=m_out,
        policy_version=draw(st.sampled_from(["v0", "v1"])),
        tool=draw(st.booleans()),
        policy_sha256=draw(st.sampled_from([None, "0" * 64, "1" * 64])),
    )


@st.composite
def rollout_specs(draw: st.DrawFn, index: int, tasks: Sequence[str], messages: bool) -> RolloutSpec:
    calls = draw(st.lists(call_specs(messages), min_size=1, max_size=6))
    n = len(calls)
    rewards: list[RewardSpanSpec] = []
    if draw(st.sampled_from([True, True, True, False])):  # the usual final reward span
        rewards.append(RewardSpanSpec(draw(_rewards), None, -1))
    for _ in range(draw(st.integers(0, 1))):  # another one: named, or a second unnamed one
        name = draw(st.sampled_from([None, "format", "format"]))
        rewards.append(RewardSpanSpec(draw(_rewards), name, draw(st.sampled_from([-1, *range(n)]))))
    late = [
        LateReward(draw(_rewards), draw(st.sampled_from(["rollout", "trace", "response"])), draw(st.integers(0, n - 1)))
        for _ in range(draw(st.integers(0, 2)))
    ]
    return RolloutSpec(
        index=index,
        rollout_id=f"rollout-{index:02d}",
        attempt_id=draw(st.sampled_from([None, None, "attempt-1"])),
        task_id=draw(st.sampled_from([*tasks, *tasks, *tasks, None])),
        agent=draw(st.sampled_from(AGENTS)),
        ids_on=draw(st.sampled_from(["root", "every"])),
        failed=draw(st.sampled_from([False, False, False, True])),
        calls=calls,
        rewards=rewards,
        late=late,
    )


class _SeededIds(IdGenerator):
    """Trace and span ids from a seeded generator: the same example gives the same ids."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def generate_span_id(self) -> int:
        return self.rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self.rng.getrandbits(128) or 1


RESOURCE = Resource.create({A.SERVICE_NAME: "lake-test-agent"})


def make_spans(r: RolloutSpec, rng: random.Random, t0: int) -> None:
    """The rollout's spans through the OTel SDK, with the ground truth (ids, times) noted on the specs."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=RESOURCE, id_generator=_SeededIds(rng))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tp.get_tracer("agentlake.tests.lake")
    ident: dict[str, Any] = {A.ROLLOUT_ID: r.rollout_id, A.AGENT_NAME: r.agent}
    if r.attempt_id:
        ident[A.ATTEMPT_ID] = r.attempt_id
    if r.task_id:
        ident[A.TASK_ID] = r.task_id
    root = tracer.start_span(A.ROLLOUT_SPAN_NAME, start_time=t0, attributes=ident)
    r.trace_id = format(root.get_span_context().trace_id, "032x")
    r.start_ns = t0
    ctx = set_span_in_context(root)
    shared = ident if r.ids_on == "every" else {}

    def reward_span(spec: RewardSpanSpec, when: int) -> None:
        attrs: dict[str, Any] = {**shared, A.REWARD_VALUE: spec.value}
        if spec.name:
            attrs[A.REWARD_NAME] = spec.name
        s = tracer.start_span(A.REWARD_SPAN_NAME, context=ctx, start_time=when, attributes=attrs)
        s.end(end_time=when + MS)
        spec.span_id, spec.start_ns = format(s.get_span_context().span_id, "016x"), when

    t = t0
    for i, c in enumerate(r.calls):
        t += 10 * MS
        attrs: dict[str, Any] = dict(shared)
        if c.agent:
            attrs[A.AGENT_NAME] = c.agent
        c.response_id = f"chatcmpl-{r.rollout_id}-{i}"
        attrs[A.GEN_AI_RESPONSE_ID] = c.response_id
        attrs[A.GEN_AI_RESPONSE_MODEL] = MODEL
        attrs[A.LLM_POLICY_VERSION] = c.policy_version
        if c.policy_sha256 is not None:
            attrs[A.LLM_POLICY_SHA256] = c.policy_sha256
        if c.prompt is not None:
            attrs[A.LLM_PROMPT_TOKEN_IDS] = c.prompt
            attrs[A.LLM_COMPLETION_TOKEN_IDS] = c.response
        if c.logprobs is not None:
            attrs[A.LLM_COMPLETION_LOGPROBS] = c.logprobs
        if c.messages_in is not None:
            attrs[A.GEN_AI_INPUT_MESSAGES] = json.dumps(c.messages_in)
            attrs[A.GEN_AI_OUTPUT_MESSAGES] = json.dumps(c.messages_out)
        s = tracer.start_span(A.LLM_CALL_SPAN_NAME, context=ctx, start_time=t, attributes=attrs)
        s.end(end_time=t + 5 * MS)
        c.span_id, c.start_ns, c.end_ns = format(s.get_span_context().span_id, "016x"), t, t + 5 * MS
        t += 5 * MS
        if c.tool:
            tool = tracer.start_span(
                "tool.calc", context=ctx, start_time=t + MS, attributes={**shared, "tool.name": "calc"}
            )
            tool.end(end_time=t + 2 * MS)
        for k, spec in enumerate(x for x in r.rewards if x.after_call == i):
            reward_span(spec, t + (3 + k) * MS)
        t += 5 * MS
    t += 10 * MS
    for k, spec in enumerate(x for x in r.rewards if x.after_call == -1):
        reward_span(spec, t + k * MS)
    t += 10 * MS
    root.set_status(Status(StatusCode.ERROR if r.failed else StatusCode.OK))
    root.end(end_time=t)
    r.end_ns = t
    tp.shutdown()
    r.spans = list(exporter.get_finished_spans())
    for j, late in enumerate(r.late):
        late.event_id = f"late-{r.rollout_id}-{j}"
        late.ts_ns = r.end_ns + (j + 1) * S


@st.composite
def workloads(
    draw: st.DrawFn, *, min_rollouts: int = 4, max_rollouts: int = 8, messages: bool = True, restart: bool = True
) -> Workload:
    """A workload and its delivery schedule; see the module docstring."""
    tasks = [f"task-{i}" for i in range(draw(st.integers(1, 3)))]
    n = draw(st.integers(min_rollouts, max_rollouts))
    rollouts = [draw(rollout_specs(i, tasks, messages)) for i in range(n)]
    # The second tenant: each of its rollouts takes the rollout id (so the response and event ids) of
    # a distinct rollout of the first, maybe its attempt id, a task of the same set, and maybe its
    # very trace and span ids (a twin: its ids drawn from the same seed).
    for src in draw(st.lists(st.integers(0, n - 1), unique=True, min_size=1, max_size=min(3, n))):
        b = draw(rollout_specs(len(rollouts), tasks, messages))
        b.tenant, b.rollout_id = TENANT_B, rollouts[src].rollout_id
        if draw(st.booleans()):
            b.attempt_id = rollouts[src].attempt_id
        if draw(st.booleans()):
            b.twin_of = src
        rollouts.append(b)
    seed = draw(st.integers(0, 2**32 - 1))
    for r in rollouts:
        rng = random.Random(seed + (r.index if r.twin_of is None else r.twin_of))
        make_spans(r, rng, BASE_NS + r.index * 2 * S)
        # export batches: the spans in the order they ended (children before the root), cut anywhere
        cuts = sorted(draw(st.sets(st.integers(1, len(r.spans) - 1), max_size=3))) if len(r.spans) > 1 else []
        bounds = [0, *cuts, len(r.spans)]
        r.chunks = [r.spans[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]

    # The batches of all rollouts interleaved (each rollout's in order, as one exporter sends them),
    # then neighbouring batches of different traces of one tenant put into one request, as a shared
    # exporter does (an exporter sends with one token).
    queues = {r.index: list(range(len(r.chunks))) for r in rollouts}
    order: list[tuple[int, int]] = []
    while queues:
        i = draw(st.sampled_from(sorted(queues)))
        order.append((i, queues[i].pop(0)))
        if not queues[i]:
            del queues[i]
    requests: list[list[tuple[int, int]]] = []
    for part in order:
        same_tenant = requests and rollouts[requests[-1][0][0]].tenant == rollouts[part[0]].tenant
        if same_tenant and part[0] not in {r for r, _ in requests[-1]} and draw(st.integers(0, 3)) == 0:
            requests[-1].append(part)
        else:
            requests.append([part])
    deliveries: list[Step] = [Send(i, draw(st.integers(0, 1))) for i in range(len(requests))]

    def last_send_of(rollout: int) -> int:
        return max(
            k
            for k, s in enumerate(deliveries)
            if isinstance(s, Send) and not s.resend and any(r == rollout for r, _ in requests[s.request])
        )

    # late rewards: after the rollout's last batch was sent, any time later
    for r in rollouts:
        for j in range(len(r.late)):
            at = draw(st.integers(last_send_of(r.index) + 1, len(deliveries)))
            deliveries.insert(at, PostReward(r.index, j, draw(st.integers(0, 1))))
    # client retries: a request (or a reward post) sent again, later, to either collector
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.integers(0, len(deliveries) - 1))
        s = deliveries[k]
        at = draw(st.integers(k + 1, len(deliveries)))
        if isinstance(s, Send):
            deliveries.insert(at, Send(s.request, draw(st.integers(0, 1)), resend=True))
        elif isinstance(s, PostReward):
            deliveries.insert(at, PostReward(s.rollout, s.reward, draw(st.integers(0, 1)), resend=True))

    # asset runs, maintenance and one broker restart, each before some delivery (or after the last)
    actions: list[tuple[int, int, Step]] = []
    for _ in range(draw(st.integers(1, 4))):
        actions.append((draw(st.integers(0, len(deliveries))), 0, Run(draw(st.sampled_from(ASSET_INCREMENTS)))))
    for _ in range(draw(st.integers(1, 2))):
        actions.append((draw(st.integers(1, len(deliveries))), 1, Maintain(recent=draw(st.booleans()))))
    if restart:
        actions.append((draw(st.integers(1, len(deliveries))), 2, Restart()))
    schedule: list[Step] = []
    by_pos: dict[int, list[Step]] = {}
    for pos, _, step in sorted(actions, key=lambda a: (a[0], a[1])):
        by_pos.setdefault(pos, []).append(step)
    for k, s in enumerate(deliveries):
        schedule.extend(by_pos.get(k, []))
        schedule.append(s)
    schedule.extend(by_pos.get(len(deliveries), []))
    return Workload(rollouts, requests, schedule)


# --- the reference ----------------------------------------------------------------------------------------
# Rules (DESIGN.md "Identity of a rollout", "Credit assignment"; issue 14):
# * every key starts with the tenant (the bearer token's): two tenants' rollouts are never one, whatever
#   ids they share (rollout, attempt, trace, span, response, event or task ids);
# * one `trajectories` row per (tenant, rollout id, attempt id); every span of the trace belongs to it,
#   whichever span carries the id and in whatever order and batches the spans arrived (duplicates count once);
# * status: `failed` when the root span has status ERROR, else `finished` (every rollout has its root);
# * rewards: the reward spans (id = span id, time = span start) and the late events (id = event id,
#   time = the event's timestamp, name `primary`), one entry per id, ordered by time then id;
# * final reward: the latest reward named `primary` (a late event re-scores the rollout), else the
#   first reward of any name, else none;
# * transitions (credit `identical`, advantage `grpo`, the defaults): one row per LLM call of an ended
#   rollout with a final reward; reward = return = R; token ids exact where recorded, else the policy's
#   chat template (`retokenized`, no logprobs); advantage = (R - mean) / (sample std + 1e-6) over the
#   rollouts of the group (the tenant's task, else the rollout itself), 0 in a group of one;
# * transition id: `rollout/attempt/step` for the default tenant, `rollout/attempt/step@tenant` for another.


def ts(ns: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=ns // 1000)


def iso(ns: int) -> str:
    return ts(ns).isoformat().replace("+00:00", "Z")


def f32(values: list[float] | None) -> list[float] | None:
    return None if values is None else [float(v) for v in np.asarray(values, np.float32)]


def reward_entries(r: RolloutSpec) -> list[dict[str, Any]]:
    out = [
        {
            "reward_id": x.span_id,
            "name": x.name or "primary",
            "value": x.value,
            "source": "span",
            "span_id": x.span_id,
            "event_time": ts(x.start_ns),
        }
        for x in r.rewards
    ]
    out += [
        {
            "reward_id": x.event_id,
            "name": "primary",
            "value": x.value,
            "source": "event",
            "span_id": None,
            "event_time": ts(x.ts_ns),
        }
        for x in r.late
    ]
    return sorted(out, key=lambda e: (e["event_time"], e["reward_id"]))


def final_reward(r: RolloutSpec) -> float | None:
    entries = reward_entries(r)
    primary = [e["value"] for e in entries if e["name"] == "primary"]
    if primary:
        return primary[-1]
    return entries[0]["value"] if entries else None


def _unique(values: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v is not None and v not in out:
            out.append(v)
    return out


def call_tokens(c: CallSpec) -> tuple[list[int], list[int], list[float] | None, str]:
    if c.prompt is not None and c.response is not None:
        return c.prompt, c.response, f32(c.logprobs), "exact"
    assert c.messages_in is not None and c.messages_out is not None
    prompt, response = template_tokens(c.messages_in, c.messages_out)
    return prompt, response, None, "retokenized"


def reference_trajectories(rollouts: Sequence[RolloutSpec]) -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    for r in rollouts:
        out[(r.tenant, r.rollout_id, r.attempt_id)] = {
            "rollout_id": r.rollout_id,
            "attempt_id": r.attempt_id,
            "tenant": r.tenant,
            "task_id": r.task_id,
            "trace_ids": [r.trace_id],
            "status": "failed" if r.failed else "finished",
            "agents": _unique([r.agent, *(c.agent for c in r.calls)]),
            "n_spans": len(r.spans),
            "n_llm_calls": len(r.calls),
            "n_repaired_parents": 0,
            "start_time": ts(r.start_ns),
            "end_time": ts(r.end_ns),
            "calls": [
                {
                    "span_id": c.span_id,
                    "step": i,
                    "agent": c.agent or r.agent,
                    "start_time": ts(c.start_ns),
                    "end_time": ts(c.end_ns),
                    "llm_response_id": c.response_id,
                    "llm_model": MODEL,
                    "policy_version": c.policy_version,
                    "prompt_token_ids": c.prompt,
                    "completion_token_ids": c.response,
                    "completion_logprobs": f32(c.logprobs),
                    "input_messages": None if c.messages_in is None else json.dumps(c.messages_in),
                    "output_messages": None if c.messages_out is None else json.dumps(c.messages_out),
                    "policy_sha256": c.policy_sha256,
                    "tools": None,  # the workload's calls declare no tools
                }
                for i, c in enumerate(r.calls)
            ],
            "rewards": reward_entries(r),
            "final_reward": final_reward(r),
            "policy_versions": _unique([c.policy_version for c in r.calls]),
            "day": ts(r.start_ns).date(),
        }
    return out


def reference_transitions(rollouts: Sequence[RolloutSpec]) -> dict[Any, dict[str, Any]]:
    trained = [r for r in rollouts if final_reward(r) is not None and r.calls]
    groups: dict[tuple[str, str], list[float]] = {}
    for r in trained:
        groups.setdefault((r.tenant, r.task_id or r.rollout_id), []).append(final_reward(r))  # type: ignore[arg-type]
    out: dict[Any, dict[str, Any]] = {}
    for r in trained:
        R = final_reward(r)
        assert R is not None
        group = r.task_id or r.rollout_id
        scores = groups[(r.tenant, group)]
        adv = (R - statistics.fmean(scores)) / (statistics.stdev(scores) + STD_EPS) if len(scores) > 1 else 0.0
        for i, c in enumerate(r.calls):
            prompt, response, logprobs, source = call_tokens(c)
            tid = f"{r.rollout_id}/{r.attempt_id or ''}/{i}" + ("" if r.tenant == TENANT else f"@{r.tenant}")
            out[tid] = {
                "transition_id": tid,
                "rollout_id": r.rollout_id,
                "attempt_id": r.attempt_id,
                "tenant": r.tenant,
                "task_id": r.task_id,
                "group_id": group,
                "step": i,
                "agent_name": c.agent or r.agent,
                "prompt_ids": prompt,
                "response_ids": response,
                "response_logprobs": logprobs,
                "loss_mask": [1] * len(response),
                "reward": R,
                "return": R,
                "advantage": adv,
                "policy_version": c.policy_version,
                "policy_sha256": c.policy_sha256,
                "llm_model": MODEL,
                "token_source": source,
                "credit_mode": "identical",
                "advantage_mode": "grpo",
                "merged_calls": 1,
                "day": ts(r.start_ns).date(),
            }
    return out


# --- comparing rows ----------------------------------------------------------------------------------------


def same(a: Any, b: Any, tol: float = 1e-6) -> bool:
    """Equal, with floats (also inside lists and structs) equal within ``tol``."""
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
            return a is b
        return math.isclose(a, b, rel_tol=tol, abs_tol=tol)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], tol) for k in a)
    return a == b


def _short(v: Any, n: int = 400) -> str:
    text = repr(v)
    return text if len(text) <= n else text[:n] + "..."


def diff_rows(
    what: str,
    got: dict[Any, dict[str, Any]],
    want: dict[Any, dict[str, Any]],
    *,
    only_wanted_columns: bool = False,
    show: int = 3,
) -> list[str]:
    """Row-for-row differences of two tables keyed alike (``got`` vs ``want``), as readable lines.

    ``only_wanted_columns``: compare the columns ``want`` has (a reference need not know columns the
    schema gains later); otherwise a column on one side only is a difference too."""
    problems: list[str] = []
    missing = sorted(set(want) - set(got), key=repr)
    extra = sorted(set(got) - set(want), key=repr)
    if missing:
        problems.append(f"{what}: {len(missing)} rows missing, first: {_short(missing[:5])}")
    if extra:
        problems.append(f"{what}: {len(extra)} unexpected rows, first: {_short(extra[:5])}")
        for k in extra[:show]:
            problems.append(f"  unexpected {k!r}: {_short(got[k], 700)}")

    def differs(k: Any) -> bool:
        if only_wanted_columns:
            return any(not same(got[k].get(c), v) for c, v in want[k].items())
        return not same(got[k], want[k])

    changed = [k for k in sorted(set(got) & set(want), key=repr) if differs(k)]
    if changed:
        problems.append(f"{what}: {len(changed)} of {len(set(got) & set(want))} common rows differ")
        for k in changed[:show]:
            names = [*want[k], *([] if only_wanted_columns else [c for c in got[k] if c not in want[k]])]
            cols = [c for c in names if not same(got[k].get(c), want[k].get(c))]
            problems.append(f"  row {k!r} differs in {cols}:")
            for c in cols:
                problems.append(f"    {c}: got  {_short(got[k].get(c))}")
                problems.append(f"    {c}: want {_short(want[k].get(c))}")
    return problems


def trajectory_view(row: dict[str, Any]) -> dict[str, Any]:
    """A lake `trajectories` row in the reference's terms: the calls' effective agent (the call's own
    agent, else the rollout's first), rewards ordered by (time, id); `updated_at` left out."""
    out = {k: v for k, v in row.items() if k != "updated_at"}
    first_agent = (row.get("agents") or [None])[0]
    calls = []
    for c in row.get("calls") or []:
        c = dict(c)
        c["agent"] = c.pop("agent_name") or first_agent
        calls.append(c)
    out["calls"] = calls
    out["rewards"] = sorted(row.get("rewards") or [], key=lambda e: (e["event_time"], e["reward_id"]))
    return out


def table_rows(uri: str, key: Sequence[str], drop: Sequence[str] = ()) -> dict[Any, dict[str, Any]]:
    """Every row of a Delta table as Python values, keyed by ``key`` (a tuple when it has several columns)."""
    import polars as pl
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        DeltaTable(uri)
    except TableNotFoundError:
        return {}
    rows = pl.read_delta(uri).drop([c for c in drop]).to_dicts()
    out: dict[Any, dict[str, Any]] = {}
    for row in rows:
        k = tuple(row[c] for c in key) if len(key) > 1 else row[key[0]]
        if k in out:  # a key twice is a difference too: show it as an extra row
            k = (k, "duplicate", len(out))
        out[k] = row
    return out


# --- the harness -----------------------------------------------------------------------------------------


class FixedBroker:
    """A broker this test cannot restart (an external Kafka, or an in-memory Tansu): restarts are skipped."""

    def __init__(self, bootstrap: str, why: str) -> None:
        self.bootstrap = bootstrap
        self.why = why
        self.restarts = 0

    def restart(self) -> None:
        pass


def lake_settings(
    bootstrap: str, root: Path, tokenizer: Path | None, partitions: int = 4, ingest_workers: int = 1
) -> Any:
    """Settings for one example: fresh topics on ``bootstrap``, a fresh lake and state under ``root``;
    ``ingest_workers`` processes ingest the span topic at once (``[ingest] workers``)."""
    from schemas.config import load_settings
    from tests.topics import fresh_kafka

    kafka = fresh_kafka(bootstrap, prefix="lake", partitions=partitions)
    overrides: dict[str, Any] = {
        "state": {"dir": str(root / "state")},
        "lake": {"root": str(root / "lake")},
        "kafka": kafka.model_dump(),
        "ingest": {"workers": ingest_workers},
        # No /tokenize check: it would ask whatever vLLM listens on the default port (a user's `make demo`
        # serving another tokenizer made messages-only calls "mismatch", untrained, and the reference differ).
        "credit": {"verify_tokens": False},
    }
    if tokenizer is not None:
        overrides["model"] = {"base": str(tokenizer)}
    return load_settings(environ={}, overrides=overrides)


def settings_env(settings: Any) -> dict[str, str]:
    """The example's settings as the environment variables a process of ours reads them from."""
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "AGENTLAKE_KAFKA__SPANS_TOPIC": settings.kafka.spans_topic,
        "AGENTLAKE_KAFKA__REWARDS_TOPIC": settings.kafka.rewards_topic,
        "AGENTLAKE_KAFKA__MODELS_TOPIC": settings.kafka.models_topic,
        "AGENTLAKE_KAFKA__PARTITIONS": str(settings.kafka.partitions),
        "AGENTLAKE_STATE_DIR": str(settings.state.dir),
        "AGENTLAKE_LAKE": settings.lake.root,
        "AGENTLAKE_CREDIT__VERIFY_TOKENS": str(settings.credit.verify_tokens).lower(),
    }
    if os.path.isdir(str(settings.model.base)):
        env["AGENTLAKE_MODEL__BASE"] = str(settings.model.base)
    return env


@contextmanager
def collectors(settings: Any, n: int = 2, *, log_dir: Path | None = None) -> Iterator[list[int]]:
    """``n`` collector processes (``python -m collectors``, replicas behind one address, say) on free
    ports; yields their OTLP/HTTP ports once each says Kafka is reachable, and stops them (SIGTERM)."""
    import httpx

    from agentlake.stack.ports import free_port

    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        for i in range(n):
            http_port, grpc_port = free_port(), free_port()
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("AGENTLAKE_")},
                **settings_env(settings),
                "AGENTLAKE_COLLECTOR__AUTH_TOKENS": json.dumps(TOKENS),
                "AGENTLAKE_COLLECTOR__HTTP_PORT": str(http_port),
                "AGENTLAKE_COLLECTOR__GRPC_PORT": str(grpc_port),
            }
            out = open(log_dir / f"collector-{i}.log", "ab") if log_dir else subprocess.DEVNULL  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "collectors"],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=Path(__file__).resolve().parents[2],
                    start_new_session=True,
                )
            )
            ports.append(http_port)
        deadline = time.monotonic() + 90
        for proc, port in zip(procs, ports, strict=True):
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"collector on port {port} exited with {proc.returncode}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"collector on port {port} did not become healthy")
                time.sleep(0.2)
        yield ports
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Client:
    """An OTLP/HTTP client that retries 429/503 and connection errors the way exporters do."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        import httpx

        self.http = httpx.Client(timeout=30.0)
        self.timeout_s = timeout_s
        self.retries = 0

    def post(self, port: int, path: str, body: bytes, content_type: str, token: str | None = None) -> bytes:
        import httpx

        deadline = time.monotonic() + self.timeout_s
        delay = 0.2
        headers = {"Content-Type": content_type}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        while True:
            try:
                resp = self.http.post(f"http://127.0.0.1:{port}{path}", content=body, headers=headers)
                if resp.status_code == 200:
                    return resp.content
                if resp.status_code not in (429, 502, 503, 504):
                    raise AssertionError(f"{path} answered {resp.status_code}: {resp.text[:500]}")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} on port {port} did not accept the request in {self.timeout_s:.0f}s")
            self.retries += 1
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def traces(self, port: int, body: bytes, token: str | None = None) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        answer = ExportTraceServiceResponse.FromString(
            self.post(port, "/v1/traces", body, "application/x-protobuf", token)
        )
        assert answer.partial_success.rejected_spans == 0, answer

    def reward(self, port: int, event: dict[str, Any], token: str | None = None) -> None:
        self.post(port, "/v1/rewards", json.dumps(event).encode(), "application/json", token)

    def close(self) -> None:
        self.http.close()


def run_assets(settings: Any, names: Sequence[str], problems: list[str] | None = None) -> dict[str, Any]:
    """Materialize the named assets and their asset checks in process, with the real Dagster
    definitions, as one run; returns the assets' metadata.

    A failed step or a failed check of severity ERROR is appended to ``problems`` (raised when None):
    a workload must never make the pipeline fail or its own checks complain.
    """
    from dagster import AssetCheckSeverity, DagsterEventType, materialize

    from pipelines.defs.assets import rewards, spans, trajectories, transitions
    from pipelines.defs.checks import all_checks
    from pipelines.defs.resources import resources_from_settings

    defs = {"spans": spans, "rewards": rewards, "trajectories": trajectories, "transitions": transitions}
    checks = [c for c in all_checks if {k.asset_key.path[-1] for k in c.check_keys} <= set(names)]
    result = materialize(
        [*(defs[n] for n in names), *checks], resources=resources_from_settings(settings), raise_on_error=False
    )
    found: list[str] = []
    for ev in result.all_events:
        if ev.event_type == DagsterEventType.STEP_FAILURE:
            error = ev.event_specific_data.error  # type: ignore[union-attr]
            found.append(f"run of {'+'.join(names)}: step {ev.step_key} failed: {error.message.strip()[:600]}")
    for check in result.get_asset_check_evaluations():
        if not check.passed and check.severity == AssetCheckSeverity.ERROR:
            meta = {k: v.value for k, v in check.metadata.items()}
            found.append(f"run of {'+'.join(names)}: check {check.asset_check_key.name} failed: {meta}")
    if not result.success and not found:
        found.append(f"run of {'+'.join(names)} failed")
    if found:
        if problems is None:
            raise AssertionError("\n".join(found))
        problems.extend(found)
    return {
        m.asset_key.path[-1]: {k: v.value for k, v in m.metadata.items()}
        for ev in result.get_asset_materialization_events()
        for m in [ev.event_specific_data.materialization]  # type: ignore[union-attr]
    }


def run_maintenance(settings: Any, *, recent: bool = False) -> None:
    """The real maintenance job (retention, clustering of finished days, compaction, vacuum), in process; with
    ``recent`` what the hourly compaction runs, on the workload's days (its clock is BASE_NS's day, not the real
    one)."""
    from pipelines.defs.automation import maintenance_job
    from pipelines.defs.resources import resources_from_settings
    from pipelines.lake.compaction import compact_recent

    res = resources_from_settings(settings)
    if recent:
        done = compact_recent(res["lake"].lake(), days=2, now=dt.datetime.fromtimestamp(BASE_NS / S, dt.UTC))
        assert not done.refused, done.refused
        return
    assert maintenance_job.execute_in_process(resources={"lake": res["lake"]}).success


def replay_cli(settings: Any, fresh_lake: Path) -> str:
    """`agentlake replay --lake FRESH` with the example's settings (broker, topics, policy tokenizer)."""
    from typer.testing import CliRunner

    from agentlake.cli import app

    env = settings_env(settings)
    out = CliRunner().invoke(app, ["replay", "--lake", str(fresh_lake)], env=env)
    assert out.exit_code == 0, out.output
    return out.output
