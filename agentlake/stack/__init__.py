"""The local stack: broker, collector, gateway, Dagster and vLLM as managed processes."""
