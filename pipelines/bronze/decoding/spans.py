"""One span record (an OTLP request, from the collector) to row tuples: the hot path of ingestion.

The record is parsed once by upb through the lite view (``schemas.otlp.lite``), which leaves token
ids and logprobs as the bytes they arrived in; a span becomes one row tuple (``rows.ROW_COLUMNS``),
with no per-span dict of columns; resource attributes are read and JSON-encoded once per resource,
and what a span's attribute keys decide is looked up by its key tuple (``columns.Shape``).
"""

from __future__ import annotations

from typing import Any

from pipelines.bronze.decoding.columns import SHAPES, ResourceColumns, as_text, first_value, new_shape, read_response_id
from pipelines.bronze.decoding.json_text import dumps
from pipelines.bronze.decoding.kafka_record import KafkaRecord
from pipelines.bronze.decoding.messages import read_messages
from pipelines.bronze.decoding.rewards import REWARD_SPAN_NAMES, span_reward
from pipelines.bronze.decoding.rows import NO_ATTRIBUTES, ROLLOUT_COLUMN
from pipelines.bronze.decoding.tokens import PackedArray, first_token_ids, logprobs
from schemas import topics
from schemas.otlp.lite import ExportTraceServiceRequestLite
from schemas.otlp.packed import PACKED_KEYS
from schemas.otlp.values import lite_value
from schemas.span_checks import SPAN_KINDS, STATUS_CODES

TokenArrays = tuple[int, Any, Any, Any]  # (row, prompt ids, completion ids, logprobs)


def decode_request(
    rec: KafkaRecord, record: int, groups: list[tuple[Any, ...]]
) -> tuple[list[tuple[Any, ...]], list[TokenArrays]]:
    """The record's spans as row tuples (``rows.ROW_COLUMNS``) and their token arrays by row index.

    ``record`` is the record's index in its batch; appends the groups the rows point to (a failed
    record leaves unused groups: harmless). Raises on anything it cannot decode.
    """
    if not rec.value:
        raise ValueError("empty record value")
    req = ExportTraceServiceRequestLite.FromString(rec.value)
    tenant = rec.header(topics.HEADER_TENANT) or topics.DEFAULT_TENANT
    received = rec.header(topics.HEADER_RECEIVED_AT)
    if received is not None:
        received_us: int | None = int(received) // 1000
    elif rec.timestamp_ms is not None:
        received_us = rec.timestamp_ms * 1000
    else:
        received_us = None
    key = rec.key.decode("utf-8", "replace") if rec.key else None
    topic, partition, offset = rec.topic, rec.partition, rec.offset
    packed_keys = PACKED_KEYS
    shapes = SHAPES
    kinds = SPAN_KINDS
    statuses = STATUS_CODES

    rows: list[tuple[Any, ...]] = []
    tokens: list[TokenArrays] = []
    # The rollout id may sit on one span of the trace only (the root); spread it over the record.
    trace_rollout: dict[bytes, str] = {}
    unresolved: list[tuple[int, bytes]] = []  # rows whose rollout comes from another span or the key
    for rs in req.resource_spans:
        res = ResourceColumns(rs.resource.attributes)
        group = len(groups)
        groups.append((tenant, res.service, res.json, received_us, topic, partition, offset))
        for ss in rs.scope_spans:
            for span in ss.spans:
                trace_id = span.trace_id
                span_id = span.span_id
                if len(trace_id) != 16 or len(span_id) != 8:
                    raise ValueError(
                        f"span {span.name!r} has a trace id of {len(trace_id)} bytes and a span id of "
                        f"{len(span_id)} bytes; OTLP needs 16 and 8"
                    )
                attrs: dict[str, Any] = {}
                for kv in span.attributes:
                    v = kv.value
                    sv = v.string_value
                    if sv:
                        attrs[kv.key] = sv
                    else:
                        k = kv.key
                        if k in packed_keys and v.HasField("array_value"):
                            # Left in wire form: the batch decodes all token arrays in one numpy pass.
                            attrs[k] = PackedArray(v.array_value, record, k)
                        else:
                            attrs[k] = lite_value(v)
                name = span.name
                if attrs:
                    keys = tuple(attrs)
                    shape = shapes.get(keys) or new_shape(keys)
                    rid = first_value(shape.rollout, attrs) if shape.rollout else None
                    if rid is None:
                        rid = res.rollout
                    if name in REWARD_SPAN_NAMES:
                        reward_value, reward_name = span_reward(name, attrs)
                    else:
                        reward_value = reward_name = None
                    if shape.messages:
                        input_messages, output_messages, tools = read_messages(shape.messages, attrs, name)
                    else:
                        input_messages = output_messages = tools = None
                    if shape.all_rest:
                        rest_json: str | None = dumps(attrs)
                    elif shape.rest:
                        rest_json = dumps({k: attrs[k] for k in shape.rest})
                    else:
                        rest_json = None
                    if shape.prompt or shape.completion or shape.logprobs:
                        tokens.append(
                            (
                                len(rows),
                                first_token_ids(shape.prompt, attrs) if shape.prompt else None,
                                first_token_ids(shape.completion, attrs) if shape.completion else None,
                                logprobs(attrs[shape.logprobs[0]], shape.logprobs[0]) if shape.logprobs else None,
                            )
                        )
                    attempt = first_value(shape.attempt, attrs) if shape.attempt else None
                    task = first_value(shape.task, attrs) if shape.task else None
                    agent = first_value(shape.agent, attrs) if shape.agent else None
                    tail: tuple[Any, ...] = (
                        as_text(attempt if attempt is not None else res.attempt),
                        as_text(task if task is not None else res.task),
                        as_text(agent if agent is not None else res.agent),
                        as_text(attrs[shape.status[0]]) if shape.status else None,
                        as_text(first_value(shape.response, attrs))
                        if shape.response
                        else (read_response_id(shape.response_readers, attrs) if shape.response_readers else None),
                        as_text(first_value(shape.model, attrs)) if shape.model else None,
                        as_text(attrs[shape.policy[0]]) if shape.policy else None,
                        input_messages,
                        output_messages,
                        reward_value,
                        reward_name,
                        rest_json,
                        as_text(attrs[shape.policy_sha[0]]) if shape.policy_sha else None,
                        tools,
                    )
                else:
                    rid = res.rollout
                    tail = (as_text(res.attempt), as_text(res.task), as_text(res.agent), *NO_ATTRIBUTES)
                if rid is not None:
                    trace_rollout.setdefault(trace_id, str(rid))
                if not rid:  # an empty or missing id takes the trace's, known once all spans are read
                    unresolved.append((len(rows), trace_id))
                parent = span.parent_span_id
                status = span.status
                rows.append(
                    (
                        trace_id.hex(),
                        span_id.hex(),
                        parent.hex() if parent else None,
                        name,
                        kinds.get(span.kind, "UNSPECIFIED"),
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        statuses.get(status.code, "UNSET"),
                        status.message or None,
                        None if rid is None else str(rid),
                        *tail,
                        group,
                    )
                )
    if not rows:
        raise ValueError("the request holds no spans")
    for i, trace_id in unresolved:
        row = rows[i]
        rollout = trace_rollout.get(trace_id)
        if rollout is None:
            # The collector keys a record by rollout id when it knows one, else by the trace id.
            trace_hex = row[0]
            rollout = key if key and key != trace_hex else trace_hex
        rows[i] = (*row[:ROLLOUT_COLUMN], rollout, *row[ROLLOUT_COLUMN + 1 :])
    return rows, tokens
