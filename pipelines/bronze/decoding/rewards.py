"""`rewards` rows: from reward spans (our convention or Agent Lightning's) and from reward events."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from pipelines.bronze import conventions
from pipelines.bronze.decoding.columns import as_text
from pipelines.bronze.decoding.kafka_record import KafkaRecord
from schemas import attributes as A
from schemas import span_checks, topics
from schemas.errors import RecordValidationError
from schemas.tables import REWARDS
from schemas.validation import validate_reward_event

_REWARD_SPANS = conventions.reward_spans()
REWARD_SPAN_NAMES = frozenset(_REWARD_SPANS)


def _reward_value(value: Any, key: str) -> float:
    """A reward as float; refused (``ValueError``) by ``span_checks.reward_value_problem``, as the collector does."""
    if (why := span_checks.reward_value_problem(value)) is not None:
        raise ValueError(f"attributes[{key}]: {why}")
    return float(value)


def span_reward(name: str, attrs: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """The reward a span named ``name`` carries and its name; unnamed rewards are primary."""
    found = span_checks.reward_attribute(name, attrs)
    if found is None:
        return None, None
    key, value = found
    name_key = _REWARD_SPANS[name].reward_name_key
    rname = attrs.get(name_key) if name_key else None
    return _reward_value(value, key), as_text(rname) or A.PRIMARY_REWARD_NAME


def decode_reward_event(rec: KafkaRecord) -> dict[str, Any]:
    """One reward event record to a `rewards` row; raises ``RecordValidationError`` on bad input."""
    if not rec.value:
        raise RecordValidationError("<record>", "empty record value")
    try:
        raw = json.loads(rec.value)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordValidationError("<record>", f"not a JSON object: {exc}") from exc
    ev = validate_reward_event(raw)
    when = ev.get("timestamp")
    if when is None:
        received = rec.header(topics.HEADER_RECEIVED_AT)
        if received is not None:
            when = dt.datetime.fromtimestamp(int(received) / 1e9, dt.UTC)
        elif rec.timestamp_ms is not None:
            when = dt.datetime.fromtimestamp(rec.timestamp_ms / 1e3, dt.UTC)
        else:
            when = dt.datetime.now(dt.UTC)
    # The collector's stamp (from the bearer token) decides; a body's own `tenant` only where no
    # collector stamped the record. The tenant keys every match of the event (pipelines/keys.py).
    tenant = rec.header(topics.HEADER_TENANT) or ev.get("tenant") or topics.DEFAULT_TENANT
    return {
        "reward_id": ev.get("event_id") or f"{rec.topic}:{rec.partition}:{rec.offset}",
        "source": "event",
        "tenant": tenant,
        "rollout_id": ev.get("rollout_id"),
        "attempt_id": ev.get("attempt_id"),
        "trace_id": ev.get("trace_id"),
        "llm_response_id": ev.get("response_id"),
        "span_id": None,
        "name": ev["name"],
        "value": ev["value"],
        "event_time": when,
        "kafka_topic": rec.topic,
        "kafka_partition": rec.partition,
        "kafka_offset": rec.offset,
        "day": when.date(),
    }


def reward_rows_from_spans(spans: pa.Table) -> pa.Table:
    """Reward spans (already decoded into `spans` rows) as `rewards` rows."""
    import polars as pl

    df = pl.from_arrow(spans)
    assert isinstance(df, pl.DataFrame)
    out = df.filter(pl.col("reward_value").is_not_null()).select(
        pl.col("span_id").alias("reward_id"),
        pl.lit("span").alias("source"),
        "tenant",
        "rollout_id",
        "attempt_id",
        "trace_id",
        "llm_response_id",
        "span_id",
        pl.col("reward_name").fill_null(A.PRIMARY_REWARD_NAME).alias("name"),
        pl.col("reward_value").alias("value"),
        pl.col("start_time").alias("event_time"),  # when the reward was given: matched against call ends
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
        "day",
    )
    return out.to_arrow().cast(REWARDS)
