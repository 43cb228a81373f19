"""The Dagster code location that turns the span log in Kafka into Delta tables.

``defs`` is what ``dagster dev`` / ``dagster asset materialize -m pipelines`` load. The pure
modules (decode, trajectories, credit, transitions, retokenize, query) import no Dagster.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy, so `import pipelines.query` (the CLI) does not pay for loading Dagster.
    if name == "defs":
        from pipelines.definitions import defs

        return defs
    raise AttributeError(name)


__all__ = ["defs"]
