"""Teardown for a stack a test brought up with `agentlake up` in its own temporary state folder.

`agentlake down` gives SeaweedFS up to 40 s to shut down cleanly, and it takes ~15 s of them (its filer
drains the S3 gateway's stream). A test that throws the state folder away has no data to keep, so its
teardown kills the object store after 2 s, as ``tests.objectstore.ObjectStore.close`` does. Tests
about `down` itself (and about data surviving it) call the real one.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentlake.stack import local
from schemas.config import Settings, load_settings

THROWAWAY_OBJECTSTORE_STOP_S = 2.0


def discard_stack(settings_or_env: Settings | Mapping[str, str]) -> list[str]:
    """Stop every part the state folder recorded, as `down` does, without waiting for SeaweedFS's drain."""
    if isinstance(settings_or_env, Settings):
        settings = settings_or_env
    else:
        settings = load_settings(environ=dict(settings_or_env))
    return local.down(settings, objectstore_stop_s=THROWAWAY_OBJECTSTORE_STOP_S)
