"""The Dagster wiring: definitions, resources, assets, sensors and schedules, asset checks."""
