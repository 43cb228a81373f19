"""The error serving raises on purpose.

AgentlakeError (schemas.errors)
└── TrainerError (trainer.errors)
    └── PublishError      vLLM refused or could not be reached, a replica did not ack; serving is unchanged

Under ``TrainerError`` with the registry's and the artifacts' errors, since a publish fails on those too.
"""

from __future__ import annotations

from trainer.errors import TrainerError


class PublishError(TrainerError):
    """A publish failed; the serving version was left as it was and the failure recorded."""
