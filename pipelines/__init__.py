"""The Dagster code location that turns the span log in Kafka into Delta tables.

``defs`` is what ``dagster dev`` (via dagster_home/workspace.yaml) and
``dagster asset materialize -m pipelines --select '*'`` load. Its rooms:

- ``bronze/``: Kafka to `spans`, `rewards`, `quarantine` (ingest, decoding, trace conventions, redaction);
- ``silver/``: `trajectories` (rollout identity, assembly, its step, reward functions, judging);
- ``gold/``: `transitions` (credit, advantage estimators, reward horizon, retokenizing, its step, variants);
- ``lake/``: operations on the whole lake (forget, retention, replay, query);
- ``defs/``: the Dagster wiring (definitions, resources, assets, automation, asset checks).

Everything outside ``defs/`` is plain code over Arrow/Polars that tests and the CLI call directly.
"""

from pipelines.defs.definitions import defs

__all__ = ["defs"]
