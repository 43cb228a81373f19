"""The agentlake error hierarchy.

    AgentlakeError
    ├── ConfigError            a setting is unknown or has a bad value
    ├── RecordValidationError  a record does not fit its schema (names the field)
    ├── LakeError              a Delta write was refused to keep the lake exactly-once
    │   ├── ConcurrentWriteError   another writer moved the same source positions first
    │   └── LogResetError          the Kafka log no longer holds what the lake says it ingested
    └── (packages add their own subclasses: StackError, CollectorError, TrainerError, ...)

Every message says what was wrong and, where it can, what to do about it.
"""

from __future__ import annotations


class AgentlakeError(Exception):
    """Base class of every error agentlake raises on purpose."""


class ConfigError(AgentlakeError):
    """A configuration key is unknown or its value is invalid."""


class RecordValidationError(AgentlakeError, ValueError):
    """A record does not match its schema; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class LakeError(AgentlakeError):
    """A lake write was refused, before anything landed, to keep the lake exactly-once."""


class ConcurrentWriteError(LakeError):
    """Another writer committed the same source positions (Delta app transactions) first.

    Raised before the refused data is committed: nothing was duplicated, nothing is lost (the other
    writer holds those records); run again to continue from where the lake is now.
    """


class LogResetError(LakeError):
    """A Kafka partition no longer holds the record at the lake's watermark: its log was reset.

    A broker that lost its log (Tansu with memory storage, restarted) or a deleted and recreated
    topic restarts offsets at 0, below what the lake already holds. Ingestion stops instead of
    skipping the new log; ``problems`` names each partition, its watermark and what the broker has.
    """

    def __init__(self, topic: str, problems: list[str], hint: str) -> None:
        self.topic = topic
        self.problems = problems
        self.hint = hint
        lines = "; ".join(problems)
        super().__init__(f"the Kafka log of topic {topic!r} was reset: {lines}. {hint}")

    def __reduce__(self) -> tuple[type[LogResetError], tuple[str, list[str], str]]:
        # rebuilt from its fields when it crosses processes (an ingest worker's, pipelines.bronze.workers)
        return LogResetError, (self.topic, self.problems, self.hint)
