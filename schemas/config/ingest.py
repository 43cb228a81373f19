"""``[ingest]``: how many ingestion workers share a topic's partitions (issue 28, scaling out)."""

from __future__ import annotations

from pydantic import Field

from schemas.config.base import Section


class IngestSettings(Section):
    """Ingestion from Kafka into the bronze tables.

    ``workers``: processes that ingest one topic at once, worker i of N owning the partitions p with
    p % N == i; each commits its own partitions' rows and offsets to the one table, exactly once
    (`pipelines.bronze.workers`). More workers than the topic has partitions is an error at run time
    (a worker would own none). ``decoders``: decoder processes per worker (-1: the machine's default
    divided among the workers; 0: each worker decodes in its own process).
    """

    workers: int = Field(1, ge=1, le=1024)
    decoders: int = Field(-1, ge=-1, le=64)
