"""The agentlake contract: record shapes, attribute names, topics, settings. Imports nothing of ours.

The table schemas and record validation load on first use (PEP 562): the agent SDK reads only the
attribute names, and `pip install agentlake` (the SDK alone) has no pyarrow.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from schemas import attributes, topics
from schemas.errors import AgentlakeError, ConfigError, RecordValidationError

if TYPE_CHECKING:
    from schemas.tables import (
        EVENTS,
        MODEL_RELEASE_EVENT,
        MODEL_VERSIONS,
        PARTITION_COLUMNS,
        QUARANTINE,
        REWARD_EVENT,
        REWARDS,
        SPANS,
        TABLES,
        TRAJECTORIES,
        TRANSITIONS,
        schema_version,
    )
    from schemas.validation import to_table, validate_record, validate_reward_event

_LAZY = {
    **dict.fromkeys(
        [
            "EVENTS",
            "MODEL_RELEASE_EVENT",
            "MODEL_VERSIONS",
            "PARTITION_COLUMNS",
            "QUARANTINE",
            "REWARD_EVENT",
            "REWARDS",
            "SPANS",
            "TABLES",
            "TRAJECTORIES",
            "TRANSITIONS",
            "schema_version",
        ],
        "schemas.tables",
    ),
    **dict.fromkeys(["to_table", "validate_record", "validate_reward_event"], "schemas.validation"),
}


def __getattr__(name: str) -> Any:  # noqa: ANN401 - whatever the named module holds
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'schemas' has no attribute {name!r}")
    return getattr(import_module(module), name)


__all__ = [
    "EVENTS",
    "MODEL_RELEASE_EVENT",
    "MODEL_VERSIONS",
    "PARTITION_COLUMNS",
    "QUARANTINE",
    "REWARDS",
    "REWARD_EVENT",
    "SPANS",
    "TABLES",
    "TRAJECTORIES",
    "TRANSITIONS",
    "AgentlakeError",
    "ConfigError",
    "RecordValidationError",
    "attributes",
    "schema_version",
    "to_table",
    "topics",
    "validate_record",
    "validate_reward_event",
]
