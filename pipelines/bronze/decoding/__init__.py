"""Kafka records to rows: OTLP span requests to `spans` rows, reward JSON to `rewards` rows.

Decoding is the hot path of ingestion. Each module does one job:

- ``kafka_record``: the record type (bytes and where they came from; no Kafka client);
- ``spans``: one span record to row tuples, through the lite view of ``schemas.otlp``;
- ``columns``: which attribute feeds which typed column; ``messages``: chat messages;
- ``tokens``: token-id and logprob columns, decoded batch-wide with numpy;
- ``rows`` and ``batch``: the row layout and the batch that turns rows into Arrow once;
- ``rewards`` and ``quarantine``: `rewards` rows and rows of refused records.
"""

from pipelines.bronze.decoding.batch import SpanBatch, decode_spans
from pipelines.bronze.decoding.kafka_record import KafkaRecord
from pipelines.bronze.decoding.quarantine import quarantine_row
from pipelines.bronze.decoding.rewards import decode_reward_event, reward_rows_from_spans

__all__ = [
    "KafkaRecord",
    "SpanBatch",
    "decode_reward_event",
    "decode_spans",
    "quarantine_row",
    "reward_rows_from_spans",
]
