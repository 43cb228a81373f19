"""Bronze: Kafka records to the `spans`, `rewards` and `quarantine` tables, exactly once (ingest, decoding)."""
