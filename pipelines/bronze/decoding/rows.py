"""The layout of a decoded span before it is Arrow: one row tuple per span, one group tuple per resource.

A row tuple holds the span's own scalar columns (start and end in nanoseconds, end 0 when the span
has not ended), then the index of its group: the columns every span of one resource in one record
shares, kept once. Token arrays are kept apart, for the few spans that have them, so that pyarrow
converts the row tuples in one call. `redacted` is left null here (not redacted): ingestion's
redaction step fills it (pipelines.bronze.redact); `day` is derived from the start time.
"""

from __future__ import annotations

import pyarrow as pa

from pipelines.bronze.decoding.tokens import TOKEN_COLUMNS
from schemas.tables import SPANS

GROUP_COLUMNS = (
    "tenant",
    "service_name",
    "resource_attributes",
    "received_at",
    "kafka_topic",
    "kafka_partition",
    "kafka_offset",
)
_DERIVED_COLUMNS = {*GROUP_COLUMNS, *TOKEN_COLUMNS, "day", "redacted"}
ROW_COLUMNS = (*(f.name for f in SPANS if f.name not in _DERIVED_COLUMNS), "group")
ROW_TYPE = pa.struct(
    [
        pa.field(c, pa.uint64() if c in ("start_time", "end_time") else pa.int64())
        if c in ("start_time", "end_time", "group")
        else SPANS.field(c)
        for c in ROW_COLUMNS
    ]
)
ROLLOUT_COLUMN = ROW_COLUMNS.index("rollout_id")
# The span-attribute columns after agent_name (status to attributes, then policy_sha256 and tools, last
# in SPANS as v4 and v5 columns): all null for a span without attributes.
NO_ATTRIBUTES = (None,) * 11
