"""The `pipelines` code location: assets, checks, jobs, sensor, schedule and resources."""

from dagster import Definitions, in_process_executor

from pipelines.defs.assets import all_assets
from pipelines.defs.automation import (
    compact_recent_job,
    compaction_schedule,
    enough_transitions_sensor,
    ingest_job,
    kafka_sensor,
    lake_automation_sensor,
    lake_job,
    maintenance_job,
    nightly_maintenance,
    policy_job,
    training_schedule,
)
from pipelines.defs.checks import all_checks
from pipelines.defs.health import health_checks, health_job, health_sensor
from pipelines.defs.resources import resources_from_settings

defs = Definitions(
    assets=all_assets,
    asset_checks=[*all_checks, *health_checks],
    jobs=[ingest_job, lake_job, policy_job, maintenance_job, compact_recent_job, health_job],
    sensors=[kafka_sensor, lake_automation_sensor, enough_transitions_sensor, health_sensor],
    schedules=[nightly_maintenance, compaction_schedule(), training_schedule()],
    resources=resources_from_settings(),
    # One process per run, not per step: a step's own process costs an import of the code location
    # (seconds here), more than ingesting a round's increment. Pools still hold one ingestion per table.
    executor=in_process_executor,
)
