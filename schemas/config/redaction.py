"""``[redaction]``: which detectors redact span text before it is stored, per tenant."""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from schemas.config.base import Section

# Detectors pipelines.bronze.redact knows by name; `redaction.patterns` adds named regexes of a deployment's own.
REDACTION_DETECTORS = ("email", "api_key", "phone")


class RedactionSettings(Section):
    """What span text is redacted before it is stored (pipelines.bronze.redact), per tenant.

    ``default``: the detectors for every tenant not in ``tenants``; ``tenants``: tenant -> its own list
    (``[]``: none). Names are built-in detectors (``email``; ``api_key``: ``sk-...`` keys, bearer
    tokens, AWS access keys, GitHub/Slack/Google tokens; ``phone``) or keys of ``patterns``
    (name -> a Python regular expression).
    """

    default: list[str] = Field(default_factory=lambda: ["email", "api_key"])
    tenants: dict[str, list[str]] = Field(default_factory=dict)
    patterns: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names_known(self) -> RedactionSettings:

        for name, regex in self.patterns.items():
            if not name or name in REDACTION_DETECTORS:
                raise ValueError(f"patterns: {name!r} must be a new name, not empty or a built-in detector")
            try:
                re.compile(regex)
            except re.error as exc:
                raise ValueError(f"patterns.{name}: not a regular expression: {exc}") from None
        known = set(REDACTION_DETECTORS) | set(self.patterns)
        for where, names in [("default", self.default), *((f"tenants.{t}", n) for t, n in self.tenants.items())]:
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(f"{where}: unknown detector {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return self

    def detectors(self, tenant: str) -> list[str]:
        """The detector names that apply to ``tenant``."""
        return list(self.tenants.get(tenant, self.default))
