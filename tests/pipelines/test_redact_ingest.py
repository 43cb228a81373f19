"""Ingestion redacts span text before it is stored, per tenant, and old `spans` tables gain `redacted`.

Real broker, real Delta tables: records go through ``ingest`` in process and in decoder processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from pipelines.bronze.ingest import ingest
from pipelines.bronze.positions import app_id, fingerprint_id
from pipelines.silver.trajectories_step import update_trajectories
from schemas import attributes as A
from schemas.config import RedactionSettings, Settings
from schemas.lake import Lake
from schemas.tables import SPANS, schema_version
from tests.pipelines.otel import Call, Rollout, make_spans, produce, span_record

pytestmark = pytest.mark.kafka

EMAIL = "alice@example.com"
KEY = "sk-" + "a1B2" * 6


def _rollout(i: int, text: str) -> Rollout:
    call = Call(
        prompt=[1, 2],
        response=[3],
        messages_in=[{"role": "user", "content": f"write to {text} please"}],
        messages_out=[{"role": "assistant", "content": "done"}],
    )
    return Rollout(f"r{i}", task_id="t", calls=[call], final_reward=1.0)


def _record(i: int, text: str, tenant: str = "default") -> dict[str, Any]:
    return span_record(make_spans(_rollout(i, text)), tenant=tenant)


def _llm_rows(lake: Lake) -> pl.DataFrame:
    spans = pl.read_delta(lake.uri("spans"))
    return spans.filter(pl.col("name") == A.LLM_CALL_SPAN_NAME).sort("rollout_id")


@pytest.mark.parametrize("workers", [0, 2])
def test_ingest_redacts_per_tenant_with_the_settings_it_is_given(
    settings: Settings, tmp_path: Path, workers: int
) -> None:
    k = settings.kafka
    produce(
        k,
        k.spans_topic,
        [_record(0, EMAIL), _record(1, KEY, tenant="acme"), _record(2, "nobody"), _record(3, EMAIL, tenant="open")],
    )
    # the default detectors for every tenant but "open" (none); "acme" also has its own pattern
    redaction = RedactionSettings(
        default=["email", "api_key"], tenants={"open": [], "acme": ["api_key", "order"]}, patterns={"order": r"ORD-\d+"}
    )
    lake = Lake(str(tmp_path / "lake"))
    res = ingest(lake, k, "spans", workers=workers, redaction=redaction)
    assert res.quarantined == 0 and res.records == 4
    rows = _llm_rows(lake)
    assert rows["rollout_id"].to_list() == ["r0", "r1", "r2", "r3"]
    assert rows["redacted"].to_list() == [["email"], ["api_key"], [], []]
    msgs = [json.loads(m)[0]["content"] for m in rows["input_messages"].to_list()]
    assert msgs == [
        "write to [REDACTED:email] please",
        "write to [REDACTED:api_key] please",
        "write to nobody please",
        f"write to {EMAIL} please",  # tenant "open" redacts nothing
    ]
    every = pl.read_delta(lake.uri("spans"))
    assert every["redacted"].null_count() == 0  # every stored row went through redaction
    assert not any(EMAIL in (v or "") for v in every.filter(pl.col("tenant") != "open")["input_messages"].to_list())


def test_ingest_without_redaction_settings_uses_the_process_settings(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``redaction=``: the settings of this process (agentlake.toml, environment) decide."""
    config = tmp_path / "agentlake.toml"
    config.write_text('[redaction]\ndefault = ["phone"]\n')
    monkeypatch.setenv("AGENTLAKE_CONFIG", str(config))
    k = settings.kafka
    produce(k, k.spans_topic, [_record(0, f"{EMAIL} or +1 415 555 0100")])
    lake = Lake(str(tmp_path / "lake"))
    ingest(lake, k, "spans", workers=0)
    (row,) = _llm_rows(lake).to_dicts()
    assert row["redacted"] == ["phone"]
    assert json.loads(row["input_messages"])[0]["content"] == f"write to {EMAIL} or [REDACTED:phone] please"


def test_a_hostile_message_list_does_not_stop_ingestion(settings: Settings, tmp_path: Path) -> None:
    """Messages nested past Python's recursion limit are no list of messages: that record is quarantined
    with the reason (kept whole, never dropped), and the rest of the batch is stored and redacted."""
    k = settings.kafka
    deep = "[" * 50_000 + json.dumps(EMAIL) + "]" * 50_000
    r = Rollout("deep", calls=[Call(prompt=[1], response=[2])])
    spans = make_spans(r)
    rec = span_record(spans)
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    req = ExportTraceServiceRequest.FromString(rec["value"])  # type: ignore[arg-type]
    req.resource_spans[0].scope_spans[0].spans[0].attributes.append(
        KeyValue(key=A.GEN_AI_INPUT_MESSAGES, value=AnyValue(string_value=deep))
    )
    rec["value"] = req.SerializeToString()
    produce(k, k.spans_topic, [rec, _record(1, EMAIL)])
    lake = Lake(str(tmp_path / "lake"))
    res = ingest(lake, k, "spans", workers=0)
    assert res.records == 2 and res.quarantined == 1
    (q,) = pl.read_delta(lake.uri("quarantine")).to_dicts()
    assert f"{A.GEN_AI_INPUT_MESSAGES} is not JSON" in q["error"] and q["value"] == rec["value"]
    stored = pl.read_delta(lake.uri("spans")).filter(pl.col("input_messages").is_not_null()).to_dicts()
    assert len(stored) == 1 and stored[0]["redacted"] == ["email"] and EMAIL not in stored[0]["input_messages"]


def test_a_spans_table_from_before_v3_gains_redacted_on_its_next_ingestion(settings: Settings, tmp_path: Path) -> None:
    """A v2 table (no `redacted`) keeps its rows and positions; the next run adds the column (null for
    the old rows), and the trajectories step reads the mixed table."""
    assert schema_version(SPANS) == 5
    k = settings.kafka
    old = [_record(i, EMAIL) for i in range(3)]
    produce(k, k.spans_topic, old)
    lake = Lake(str(tmp_path / "lake"))
    # what a v2 ingestion left: its rows without `redacted`, its positions (and record fingerprints)
    ingest(Lake(str(tmp_path / "scratch")), k, "spans", workers=0)
    scratch = DeltaTable(str(tmp_path / "scratch" / "spans"))
    v4_only = SPANS.remove(SPANS.get_field_index("tools")).remove(
        SPANS.get_field_index("policy_sha256")
    )  # v4, v5 later
    v2 = v4_only.remove(v4_only.get_field_index("redacted")).with_metadata(
        {**SPANS.metadata, b"agentlake.schema.version": b"2"}
    )
    rows = scratch.to_pyarrow_table().select(v2.names).cast(v2)
    marks = [
        Transaction(a, v)
        for p in set(rows.column("kafka_partition").to_pylist())
        for a in (app_id(k.spans_topic, p), fingerprint_id(k.spans_topic, p))
        if (v := scratch.transaction_version(a)) is not None
    ]
    write_deltalake(
        lake.uri("spans"), rows, partition_by=["day"], commit_properties=CommitProperties(app_transactions=marks)
    )
    assert "redacted" not in DeltaTable(lake.uri("spans")).schema().to_arrow().names

    produce(k, k.spans_topic, [_record(3, EMAIL), _record(4, "nobody")])
    res = ingest(lake, k, "spans", workers=0)
    assert res.records == 2 and res.quarantined == 0  # only the new records: the old position held
    dt = DeltaTable(lake.uri("spans"))
    assert dt.schema().to_arrow().field("redacted").type == pa.list_(pa.string())
    llm = _llm_rows(lake)
    assert llm["rollout_id"].to_list() == ["r0", "r1", "r2", "r3", "r4"]
    assert llm["redacted"].to_list() == [None, None, None, ["email"], []]
    every = pl.read_delta(lake.uri("spans"))
    old_rows = every.filter(pl.col("rollout_id").is_in(["r0", "r1", "r2"]))
    assert old_rows.height > 3 and old_rows["redacted"].null_count() == old_rows.height
    assert every.filter(~pl.col("rollout_id").is_in(["r0", "r1", "r2"]))["redacted"].null_count() == 0
    # downstream reads the table with both kinds of files
    traj = update_trajectories(lake, k, idle_timeout_s=300)
    assert traj.rollouts == 5
    got = pl.read_delta(lake.uri("trajectories")).sort("rollout_id")
    assert got["rollout_id"].to_list() == ["r0", "r1", "r2", "r3", "r4"]
    assert got["n_llm_calls"].to_list() == [1] * 5
