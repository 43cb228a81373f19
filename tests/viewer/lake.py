"""A small lake for the viewer's tests, built by the real pipeline: scripted OTel rollouts decoded as
ingestion does, then the silver and gold steps, a credit variant, a reward event, the judge's rows
(its cache's writer) and a training lineage row (the trainer's writer).

Two tenants: ``default`` (rollouts r0..r3, task ``a`` or ``b``) and ``acme`` (a0, a1 and its own ``r0``,
the same id as default's, to show that ids do not cross tenants).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

import pyarrow as pa

from pipelines.bronze.decoding import KafkaRecord, decode_spans
from pipelines.bronze.decoding.rewards import decode_reward_event
from pipelines.gold.transitions_step import update_transitions
from pipelines.gold.variants import rebuild_variant
from pipelines.silver.judging.cache import store
from pipelines.silver.trajectories_step import update_trajectories
from schemas import topics
from schemas.config import CreditSettings
from schemas.lake import Lake
from schemas.tables import REWARDS
from tests.pipelines.otel import Call, Rollout, encode, make_spans
from tests.pipelines.test_identity import KAFKA, NOW
from trainer.lineage import Lineage

T0 = 1_750_000_000  # 2025-06-15, seconds


@dataclass(frozen=True)
class Spec:
    tenant: str
    rollout_id: str
    task: str
    agent: str
    reward: float
    calls: int


SPECS = [
    Spec("default", "r0", "a", "solver", 1.0, 3),
    Spec("default", "r1", "a", "solver", 0.0, 2),
    Spec("default", "r2", "a", "critic", 0.5, 1),
    Spec("default", "r3", "b", "solver", 1.0, 2),
    Spec("acme", "a0", "a", "acme-bot", 0.25, 2),
    Spec("acme", "a1", "c", "acme-bot", 0.75, 1),
    Spec("acme", "r0", "c", "acme-bot", 0.1, 1),
]
TOOL_RESULT = "the calculator says 42"
JUDGE_REASON = "r1 answered without checking the tool's result"


def _messages(i: int, k: int) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    call_id = f"call-{i}-{k}"
    inputs: list[dict[str, object]] = [
        {"role": "system", "content": "You are a careful solver."},
        {"role": "user", "content": f"What is 6 times 7? (try {k})"},
    ]
    if k > 0:
        inputs += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "calc", "arguments": '{"x": "6*7"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": TOOL_RESULT},
        ]
    outputs: list[dict[str, object]] = [{"role": "assistant", "content": f"The answer is {40 + k}."}]
    return inputs, outputs


def _prompt(i: int, k: int, spec: Spec) -> list[int]:
    """Default's r0 is one conversation: each call's prompt extends the last call's prompt and answer with
    two observation tokens, so the gold step merges its calls into one transition with masked tokens."""
    if spec.rollout_id != "r0" or spec.tenant != "default" or k == 0:
        return [1, 2000 + i, 3000 + k]
    return [*_prompt(i, k - 1, spec), *_response(i, k - 1), *OBSERVATION]


def _response(i: int, k: int) -> list[int]:
    return [4000 + k, 5000 + i, 6000]


OBSERVATION = [7000, 7001]


def _record(i: int, spec: Spec) -> KafkaRecord:
    calls = [
        Call(
            prompt=_prompt(i, k, spec),
            response=_response(i, k),
            logprobs=[-0.5, -0.25, -1.5],
            messages_in=_messages(i, k)[0],  # type: ignore[arg-type]
            messages_out=_messages(i, k)[1],  # type: ignore[arg-type]
            agent=spec.agent,
            # as the gateway records it: the served name @ the adapter's folder (the registry's version)
            policy_version="agentlake-policy@v0001" if spec.rollout_id != "r3" else "agentlake-policy@v0002",
        )
        for k in range(spec.calls)
    ]
    r = Rollout(
        spec.rollout_id,
        task_id=spec.task,
        calls=calls,
        final_reward=spec.reward,
        agent=spec.agent,
        t0_ns=(T0 + i * 60) * 10**9,
    )
    headers = [(topics.HEADER_TENANT, spec.tenant.encode())]
    return KafkaRecord("s", 0, i, None, encode(make_spans(r)), headers)


def reward_event(rollout_id: str, value: float) -> KafkaRecord:
    """A late reward as ``/v1/rewards`` produces it (decoded by ingestion's own decoder)."""
    event = {"rollout_id": rollout_id, "value": value, "name": "human", "event_id": f"ev-{rollout_id}"}
    headers = [(topics.HEADER_TENANT, b"default"), (topics.HEADER_RECEIVED_AT, str((T0 + 30) * 10**9).encode())]
    return KafkaRecord("r", 0, 0, rollout_id.encode(), json.dumps(event).encode(), headers)


def build_lake(root: str) -> Lake:
    lake = Lake(root)
    recs = [_record(i, s) for i, s in enumerate(SPECS)]
    lake.write("spans", decode_spans(recs)[0], txns={"kafka:s:0": recs[-1].offset})
    lake.write("rewards", pa.Table.from_pylist([decode_reward_event(reward_event("r0", 0.9))], schema=REWARDS))
    update_trajectories(lake, KAFKA, idle_timeout_s=1e9, now=NOW)
    update_transitions(lake, CreditSettings(merge_calls=True), now=NOW)
    variant = CreditSettings(mode="discounted", gamma=0.9, advantage="rloo", merge_calls=True)
    rebuild_variant(lake, variant, name="disc09", now=NOW)
    judged = [("r0", 1, 9.0, 1.0, "r0 checked the tool and answered 42"), ("r1", 2, 2.0, 0.0, JUDGE_REASON)]
    store(
        lake,
        [
            {
                "judgement_id": "j1",
                "source": "fn:judge@1",
                "tenant": "default",
                "rollout_id": rid,
                "attempt_id": None,
                "position": pos,
                "members": 2,
                "status": "ok",
                "score": score,
                "reward": reward,
                "reason": reason,
                "model": "judge-model",
                "calls": 1,
            }
            for rid, pos, score, reward, reason in judged
        ],
        now=NOW,
    )
    trained = pa.table({"transition_id": ["r0//0", "r3//0"], "rollout_id": ["r0", "r3"]})
    Lineage(lake).record(model_version="v0002", train_table=lake.uri("transitions"), table_version=1, rows=trained)
    return lake


def when(i: int) -> dt.datetime:
    """The start time of ``SPECS[i]``."""
    return dt.datetime.fromtimestamp(T0 + i * 60, dt.UTC)
