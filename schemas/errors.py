"""The agentlake error hierarchy.

    AgentlakeError
    ├── ConfigError            a setting is unknown or has a bad value
    ├── RecordValidationError  a record does not fit its schema (names the field)
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
