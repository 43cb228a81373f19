"""The agentlake contract: record shapes, attribute names, topics, settings. Imports nothing of ours."""

from schemas import attributes, topics
from schemas.errors import AgentlakeError, ConfigError, RecordValidationError
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
