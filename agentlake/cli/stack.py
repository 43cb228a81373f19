"""`agentlake up | status | down`: the local stack."""

from __future__ import annotations
