"""Errors the trainer raises on purpose.

AgentlakeError (schemas.errors)
└── TrainerError          bad trainer config, no data, a missing base model
    ├── RegistryError     the model_versions table has no such version, or a bad state change
    ├── ArtifactError     a version's stored files are missing or do not match their manifest
    └── PublishError      (serving.errors) vLLM refused or could not be reached; serving is unchanged
"""

from __future__ import annotations

from schemas.errors import AgentlakeError


class TrainerError(AgentlakeError):
    """Training could not start or finish; the message says what to change."""


class RegistryError(TrainerError):
    """A model version is unknown, or a status change is not allowed."""


class ArtifactError(TrainerError):
    """A model version's files could not be stored, found, or verified against their manifest."""
