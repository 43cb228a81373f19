"""How long ``batches`` waits for a silent broker: while it owes records, long; once it owes none, idle_ms.

The 8-worker benchmark on 8 partitions found the fault for real (a run ended 300 ms into a busy broker's
first fetch and left whole partitions unread: 70-84% of the backlog ingested). A real broker cannot be
made to answer its first fetch late on demand, so these tests drive ``batches`` with a scripted consumer
that hands out real ``confluent_kafka.Message`` objects on a clock; the last test checks what that
consumer stands in for (watermarks and positions) against the real broker and librdkafka.
"""

from __future__ import annotations

import time

from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, TopicPartition

from pipelines.bronze.fetch import batches, make_fetcher, owed, topic_partitions
from schemas.config import KafkaSettings
from tests.pipelines.otel import produce

TOPIC = "spans"


class ScriptedConsumer:
    """Each partition's records in chunks, each chunk ready from its time on (seconds after the start),
    then its end-of-partition event; a partition with no chunks never answers. Its cached high
    watermark and position are what librdkafka's would be: unknown until the partition first answers."""

    def __init__(self, chunks: dict[int, list[tuple[float, int]]], *, eof: bool = True) -> None:
        self.t0 = time.monotonic()
        self.chunks = {p: list(cs) for p, cs in chunks.items()}
        self.total = {p: sum(n for _, n in cs) for p, cs in chunks.items()}
        self.eof = eof
        self.next = dict.fromkeys(chunks, 0)  # the next offset to hand out
        self.ready = dict.fromkeys(chunks, 0)  # records whose chunk's time has come
        self.answered: set[int] = set()
        self.ended: set[int] = set()  # partitions whose end-of-partition event was handed out

    def assign(self, assignments: list[TopicPartition]) -> None:
        assert sorted(tp.partition for tp in assignments) == sorted(self.chunks)

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        now = time.monotonic() - self.t0
        for p, cs in self.chunks.items():
            while cs and cs[0][0] <= now:
                self.ready[p] += cs.pop(0)[1]
                self.answered.add(p)
        for p in self.chunks:
            n = min(num_messages, self.ready[p] - self.next[p])
            if n > 0:
                first, self.next[p] = self.next[p], self.next[p] + n
                return [self.record(p, o) for o in range(first, first + n)]
            if self.eof and p in self.answered and p not in self.ended and self.next[p] == self.total[p]:
                self.ended.add(p)
                return [Message(topic=TOPIC, partition=p, error=KafkaError(KafkaError._PARTITION_EOF))]
        time.sleep(timeout)
        return []

    def record(self, p: int, offset: int) -> Message:
        return Message(topic=TOPIC, partition=p, offset=offset, key=b"k", value=b"v", timestamp=(1, 1))

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        if tp.partition not in self.answered:
            return -1001, -1001
        return 0, self.total[tp.partition]

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, tp.partition, self.next[tp.partition] or -1001) for tp in tps]


def read_all(consumer: ScriptedConsumer, parts: list[int], **kw: int) -> tuple[dict[int, int], float]:
    t0 = time.monotonic()
    got: dict[int, int] = {}
    for batch in batches(consumer, TOPIC, dict.fromkeys(parts), 100, 300, **kw):
        for r in batch:
            got[r.partition] = got.get(r.partition, 0) + 1
    return got, time.monotonic() - t0


def test_a_first_answer_slower_than_idle_ms_is_waited_for() -> None:
    consumer = ScriptedConsumer({0: [(1.0, 250)], 1: [(0.2, 40)]})
    got, seconds = read_all(consumer, [0, 1], stall_ms=5_000)
    assert got == {0: 250, 1: 40}  # before the fix: {1: 40}, partition 0 left unread
    assert seconds < 3  # it ended at the end-of-partition events, not at the patience limit


def test_a_pause_while_records_are_owed_is_waited_for() -> None:
    consumer = ScriptedConsumer({0: [(0.0, 150), (1.2, 150)]})
    got, seconds = read_all(consumer, [0], stall_ms=5_000)
    assert got == {0: 300}  # before the fix: {0: 150}
    assert seconds < 4


def test_a_partition_that_never_answers_ends_the_run_after_stall_ms() -> None:
    consumer = ScriptedConsumer({0: [(0.0, 30)], 1: []})
    got, seconds = read_all(consumer, [0, 1], stall_ms=1_500)
    assert got == {0: 30}
    assert 1.4 <= seconds < 4


def test_silence_with_nothing_owed_ends_after_idle_ms() -> None:
    consumer = ScriptedConsumer({0: [(0.0, 30)]}, eof=False)  # its end-of-partition event never comes
    got, seconds = read_all(consumer, [0], stall_ms=60_000)
    assert got == {0: 30}
    assert seconds < 2  # idle_ms (300 ms), not stall_ms


def test_owed_reads_a_real_consumers_watermarks_and_positions(kafka_settings: KafkaSettings) -> None:
    """``owed`` against the real broker and librdkafka: owed before the first answer, owed with records
    left past the position, not owed once every partition reported its end."""
    produce(
        kafka_settings,
        kafka_settings.spans_topic,
        [{"key": f"k{i}".encode(), "value": b"v", "headers": []} for i in range(200)],
    )
    consumer = make_fetcher(kafka_settings)
    try:
        parts = topic_partitions(consumer, kafka_settings.spans_topic)
        consumer.assign([TopicPartition(kafka_settings.spans_topic, p, OFFSET_BEGINNING) for p in parts])
        assert owed(consumer, kafka_settings.spans_topic, parts)  # nothing fetched yet
        first: Message | None = None
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            first = next((m for m in consumer.consume(1, timeout=0.5) if m.error() is None), None)
        assert first is not None
        assert owed(consumer, kafka_settings.spans_topic, [first.partition()])  # one of its records read
        ended: set[int] = set()
        while ended != set(parts) and time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=0.5):
                if m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
        assert ended == set(parts)
        assert not owed(consumer, kafka_settings.spans_topic, parts)
    finally:
        consumer.close()
