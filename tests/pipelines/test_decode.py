"""Span decoding without Kafka: the batch-wide token-array pass agrees with item-by-item reading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

import pipelines.bronze.decoding
from pipelines.bronze.decoding import KafkaRecord, SpanBatch
from pipelines.bronze.ingest import ingest
from schemas import attributes as A
from schemas import span_checks
from schemas.config import Settings
from schemas.lake import Lake
from schemas.otlp.values import any_value
from tests.pipelines.otel import Call, Rollout, encode, make_spans, produce, span_record


def record(r: Rollout, offset: int) -> KafkaRecord:
    return KafkaRecord("t", 0, offset, r.rollout_id.encode() if r.rollout_id else None, encode(make_spans(r)), [])


def test_public_names_are_exported() -> None:
    names = pipelines.bronze.decoding.__all__
    assert names == sorted(set(names))
    assert all(hasattr(pipelines.bronze.decoding, name) for name in names)


def test_nested_attribute_values_read_as_the_real_messages_read_them() -> None:
    """The lite parse keeps arrays and kvlists as bytes; what lands in `attributes` is unchanged."""
    values = {
        "tags": AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a"), AnyValue(string_value="b")])),
        "scores": AnyValue(array_value=ArrayValue(values=[AnyValue(double_value=0.25), AnyValue(double_value=1.5)])),
        "mixed": AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(bool_value=True)])),
        "nested": AnyValue(
            kvlist_value=KeyValueList(
                values=[
                    KeyValue(key="k", value=AnyValue(int_value=3)),
                    KeyValue(key="deeper", value=AnyValue(kvlist_value=KeyValueList(values=[]))),
                ]
            )
        ),
        "raw": AnyValue(bytes_value=b"\x00\xff"),
        "flag": AnyValue(bool_value=False),
        "empty": AnyValue(array_value=ArrayValue()),
    }
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="deployment", value=values["nested"])
    span = rs.scope_spans.add().spans.add(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="tool", start_time_unix_nano=1_750_000_000_000_000_000
    )
    span.attributes.extend([KeyValue(key=k, value=v) for k, v in values.items()])
    batch = SpanBatch()
    assert batch.add(KafkaRecord("t", 0, 0, b"k", req.SerializeToString(), [])) == 1
    row = batch.to_table().to_pylist()[0]
    expected = json.dumps({k: any_value(v) for k, v in values.items()}, default=lambda a: a.tolist())
    assert json.loads(row["attributes"]) == json.loads(expected)
    assert json.loads(row["attributes"])["scores"] == [0.25, 1.5]
    assert json.loads(row["resource_attributes"]) == {"deployment": {"k": 3, "deeper": {}}}


def test_token_columns_and_late_quarantine() -> None:
    calls = [Call(prompt=[1, 2, 40000], response=[7], logprobs=[-0.25]), Call(prompt=[], response=[])]
    good = Rollout("g", calls=calls)
    bad = Rollout("b", calls=[Call(prompt=[1, 2**31], response=[3])])  # out of range: found in the batch pass
    floats = Rollout("f", calls=[Call(prompt=[1.5], response=[3])])  # not integers: the slow path's error
    batch = SpanBatch()
    for i, r in enumerate([good, bad, good, floats]):
        batch.add(record(r, i))
    table = batch.to_table()
    assert sorted(set(table.column("rollout_id").to_pylist())) == ["g"]
    calls = table.filter(np.array([n == A.LLM_CALL_SPAN_NAME for n in table.column("name").to_pylist()]))
    assert calls.column("prompt_token_ids").to_pylist() == [[1, 2, 40000], [], [1, 2, 40000], []]
    assert calls.column("completion_token_ids").to_pylist() == [[7], [], [7], []]
    assert calls.column("completion_logprobs").to_pylist() == [[-0.25], None, [-0.25], None]
    q = batch.quarantine
    assert [row["kafka_offset"] for row in q] == [1, 3]
    # the reasons are schemas.span_checks' (the collector refuses such a span with the same words)
    key = A.LLM_PROMPT_TOKEN_IDS
    assert q[0]["error"] == f"ValueError: attributes[{key}]: item 1 is 2147483648, token ids are between 0 and 2**31-1"
    assert q[1]["error"] == f"ValueError: attributes[{key}]: item 0 is float, token ids are integers"


def test_token_ids_as_json_string_and_mixed_arrays() -> None:
    """Token ids some SDKs write as a JSON string, and an array that mixes kinds, read as before."""
    req = ExportTraceServiceRequest()
    span = (
        req.resource_spans.add()
        .scope_spans.add()
        .spans.add(
            trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="llm", start_time_unix_nano=1_750_000_000_000_000_000
        )
    )
    span.attributes.extend(
        [
            KeyValue(key=A.AGL_PROMPT_TOKEN_IDS, value=AnyValue(string_value="[4, 5]")),
            KeyValue(
                key=A.LLM_COMPLETION_LOGPROBS,
                value=AnyValue(array_value=ArrayValue(values=[AnyValue(double_value=-1.0), AnyValue(int_value=2)])),
            ),
            KeyValue(key="custom", value=AnyValue(double_value=0.5)),
        ]
    )
    batch = SpanBatch()
    assert batch.add(KafkaRecord("t", 0, 0, b"k", req.SerializeToString(), [])) == 1
    row = batch.to_table().to_pylist()[0]
    assert row["prompt_token_ids"] == [4, 5]
    assert row["completion_logprobs"] == pytest.approx([-1.0, 0.0])  # a non-double item reads as 0.0
    assert row["attributes"] == '{"custom": 0.5}'
    assert row["rollout_id"] == "k" and row["end_time"] is None


def _llm_span(attrs: dict[str, AnyValue], name: str = "llm") -> bytes:
    req = ExportTraceServiceRequest()
    span = (
        req.resource_spans.add()
        .scope_spans.add()
        .spans.add(
            trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name=name, start_time_unix_nano=1_750_000_000_000_000_000
        )
    )
    span.attributes.extend([KeyValue(key=k, value=v) for k, v in attrs.items()])
    return req.SerializeToString()


def _doubles(values: list[float]) -> AnyValue:
    return AnyValue(array_value=ArrayValue(values=[AnyValue(double_value=v) for v in values]))


def _int_values(values: list[int]) -> AnyValue:
    return AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=v) for v in values]))


def _plain(v: AnyValue) -> object:
    """An attribute as span_checks takes it (plain Python, as the collector reads it)."""
    return any_value(v)


BAD_TOKENS: list[tuple[str, AnyValue]] = [
    (A.LLM_PROMPT_TOKEN_IDS, _int_values([1, -1])),  # a negative varint: refused by the batch pass
    (A.LLM_COMPLETION_TOKEN_IDS, _int_values([2**31])),
    (A.AGL_RESPONSE_TOKEN_IDS, AnyValue(string_value="[1, -5]")),
    (A.AGL_PROMPT_TOKEN_IDS, AnyValue(string_value="[[1]]")),
    (A.AGL_PROMPT_TOKEN_IDS, AnyValue(string_value="[1, true]")),
    (A.AGL_PROMPT_TOKEN_IDS, AnyValue(string_value="not json")),
    (A.AGL_PROMPT_TOKEN_IDS, AnyValue(int_value=5)),
    (A.AGL_WEAVE_RESPONSE_TOKEN_IDS[1], _int_values([3, -2])),
    (A.LLM_PROMPT_TOKEN_IDS, AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="1")]))),
    (A.LLM_COMPLETION_LOGPROBS, _doubles([-0.5, float("nan")])),  # clean doubles: the batch pass sees the NaN
    (A.LLM_COMPLETION_LOGPROBS, AnyValue(string_value="[-0.5, NaN]")),
    (A.LLM_COMPLETION_LOGPROBS, AnyValue(string_value='["-0.5"]')),
    (A.LLM_COMPLETION_LOGPROBS, AnyValue(string_value="-0.5")),
    (A.LLM_COMPLETION_LOGPROBS, AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a")]))),
]


@pytest.mark.parametrize(("key", "value"), BAD_TOKENS, ids=[f"{k}={v}"[:60] for k, v in BAD_TOKENS])
def test_token_arrays_are_refused_by_the_span_checks_rule(key: str, value: AnyValue) -> None:
    """Decoding quarantines exactly what schemas.span_checks refuses, with its reason, fast path or slow."""
    batch = SpanBatch()
    batch.add(KafkaRecord("t", 0, 0, b"k", _llm_span({key: value}), []))
    assert batch.to_table().num_rows == 0
    (q,) = batch.quarantine
    why = span_checks.attributes_problem("llm", {key: _plain(value)})
    assert why is not None and q["error"] == f"ValueError: {why}"


def test_clean_token_arrays_pass_the_rule_and_decode() -> None:
    attrs = {
        A.LLM_PROMPT_TOKEN_IDS: _int_values([0, 5, 2**31 - 1]),
        A.AGL_RESPONSE_TOKEN_IDS: AnyValue(string_value="[7, 8]"),
        A.LLM_COMPLETION_LOGPROBS: _doubles([-0.5, float("-inf")]),  # -inf is a number: kept
    }
    assert span_checks.attributes_problem("llm", {k: _plain(v) for k, v in attrs.items()}) is None
    batch = SpanBatch()
    assert batch.add(KafkaRecord("t", 0, 0, b"k", _llm_span(attrs), [])) == 1
    (row,) = batch.to_table().to_pylist()
    assert not batch.quarantine
    assert row["prompt_token_ids"] == [0, 5, 2**31 - 1] and row["completion_token_ids"] == [7, 8]
    assert row["completion_logprobs"] == [-0.5, float("-inf")]
    assert row["redacted"] is None  # decoding alone does not redact: ingestion does


@pytest.mark.parametrize("completion_key", A.AGL_WEAVE_RESPONSE_TOKEN_IDS)
def test_agent_lightning_weave_tracer_ids_decode(completion_key: str) -> None:
    """Agent Lightning's Weave tracer flattens the call's output: its ids and response id are read (they
    were dropped before; `tests/stack/test_conventions_vllm.py` checks them against real vLLM)."""
    attrs = {
        A.AGL_WEAVE_PROMPT_TOKEN_IDS: _int_values([1, 2, 3]),
        completion_key: _int_values([4, 5]),
        A.AGL_WEAVE_RESPONSE_ID: AnyValue(string_value="chatcmpl-7"),
    }
    batch = SpanBatch()
    assert batch.add(KafkaRecord("t", 0, 0, b"k", _llm_span(attrs), [])) == 1
    (row,) = batch.to_table().to_pylist()
    assert (row["prompt_token_ids"], row["completion_token_ids"]) == ([1, 2, 3], [4, 5])
    assert row["llm_response_id"] == "chatcmpl-7"


def test_deeply_nested_openinference_output_is_no_response_id() -> None:
    """An OpenInference LLM span whose output.value nests past the JSON parser's depth is stored, without id."""
    deep = '{"id": "resp-1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    attrs = {
        A.OI_SPAN_KIND: AnyValue(string_value=A.OI_SPAN_KIND_LLM),
        A.OI_OUTPUT_VALUE: AnyValue(string_value=deep),
    }
    batch = SpanBatch()
    assert batch.add(KafkaRecord("t", 0, 0, b"k", _llm_span(attrs), [])) == 1
    assert not batch.quarantine
    (row,) = batch.to_table().to_pylist()
    assert row["llm_response_id"] is None
    # the same span with a shallow body keeps its id: the deep one lost it to the depth only
    attrs[A.OI_OUTPUT_VALUE] = AnyValue(string_value='{"id": "resp-1", "x": [[]]}')
    batch = SpanBatch()
    batch.add(KafkaRecord("t", 0, 0, b"k", _llm_span(attrs), []))
    assert batch.to_table().column("llm_response_id").to_pylist() == ["resp-1"]


@pytest.mark.kafka
def test_decoder_processes_give_the_same_table(settings: Settings, tmp_path: Path) -> None:
    """Ingesting with decoder processes writes what in-process decoding writes, quarantine included."""
    k = settings.kafka
    records = [
        span_record(make_spans(Rollout(f"w{i}", task_id="t", calls=[Call(prompt=[i], response=[2])])))
        for i in range(60)
    ]
    records.insert(7, {"key": b"junk", "value": b"\x00not protobuf", "headers": []})
    produce(k, k.spans_topic, records)
    tables = {}
    for workers in (0, 2):
        lake = Lake(str(tmp_path / f"lake{workers}"))
        res = ingest(lake, k, "spans", batch_records=16, workers=workers)
        assert res.records == 61 and res.quarantined == 1 and res.lag == 0
        tables[workers] = pl.read_delta(lake.uri("spans")).sort("kafka_partition", "kafka_offset", "span_id")
    assert tables[0].equals(tables[2])


BAD_REWARDS: list[tuple[str, str, AnyValue]] = [
    (A.REWARD_SPAN_NAME, A.REWARD_VALUE, AnyValue(double_value=float("nan"))),
    (A.REWARD_SPAN_NAME, A.REWARD_VALUE, AnyValue(double_value=float("inf"))),
    (A.REWARD_SPAN_NAME, A.REWARD_VALUE, AnyValue(string_value="abc")),
    (A.AGL_REWARD_SPAN_NAME, A.AGL_LEGACY_REWARD, AnyValue(string_value="-inf")),
]


@pytest.mark.parametrize(("name", "key", "value"), BAD_REWARDS, ids=[f"{k}={v}"[:60] for _, k, v in BAD_REWARDS])
def test_reward_values_are_refused_by_the_span_checks_rule(name: str, key: str, value: AnyValue) -> None:
    """A reward span whose value is not a finite number is quarantined with the collector's reason."""
    batch = SpanBatch()
    batch.add(KafkaRecord("t", 0, 0, b"k", _llm_span({key: value}, name=name), []))
    assert batch.to_table().num_rows == 0
    (q,) = batch.quarantine
    why = span_checks.attributes_problem(name, {key: _plain(value)})
    assert why is not None and q["error"] == f"ValueError: {why}"
