"""The Dagster code location that turns the span log in Kafka into Delta tables.

``defs`` is what ``dagster dev`` (via dagster_home/workspace.yaml) and
``dagster asset materialize -m pipelines --select '*'`` load. The modules it is built from
(decoding, ingest, incremental, identity, trajectories, transitions, credit, retokenize, query, replay) are plain code
over Arrow/Polars that tests and the CLI call directly.
"""

from pipelines.defs.definitions import defs

__all__ = ["defs"]
