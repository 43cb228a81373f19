"""Operations on the whole lake: forget (erasure), retention, replay from Kafka, queries, health (collapse signals)."""
