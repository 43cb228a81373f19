"""How long ``batches`` waits for a silent broker: a slow first answer is waited for, later silence is not.

The 8-worker benchmark on 8 partitions found the fault for real (a run ended 300 ms into a busy broker's
first fetch and left whole partitions unread: 70-84% of the backlog ingested). A real broker cannot be
made to answer its first fetch late on demand, so these tests drive ``batches`` with a scripted consumer
that hands out real ``confluent_kafka.Message`` objects on a clock: the one stand-in in these tests.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, Message

from pipelines.bronze.fetch import batches

TOPIC = "spans"


class ScriptedConsumer:
    """Each partition's records, then its end-of-partition event, from ``answers_at[p]`` seconds on
    (``None``: that partition never answers)."""

    def __init__(self, records: dict[int, int], answers_at: dict[int, float | None]) -> None:
        self.t0 = time.monotonic()
        self.queue = {
            p: [Message(topic=TOPIC, partition=p, offset=o, key=b"k", value=b"v", timestamp=(1, 1)) for o in range(n)]
            + [Message(topic=TOPIC, partition=p, offset=n, error=KafkaError(KafkaError._PARTITION_EOF))]
            for p, n in records.items()
        }
        self.answers_at = answers_at

    def assign(self, assignments: list) -> None:
        assert sorted(tp.partition for tp in assignments) == sorted(self.queue)

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        now = time.monotonic() - self.t0
        ready = [p for p, at in self.answers_at.items() if at is not None and now >= at and self.queue[p]]
        if not ready:
            time.sleep(timeout)
            return []
        out, self.queue[ready[0]] = self.queue[ready[0]][:num_messages], self.queue[ready[0]][num_messages:]
        return out


def read_all(consumer: ScriptedConsumer, parts: list[int], **kw: int) -> tuple[dict[int, int], float]:
    t0 = time.monotonic()
    got: dict[int, int] = {}
    for batch in batches(consumer, TOPIC, dict.fromkeys(parts), 100, 300, **kw):
        for r in batch:
            got[r.partition] = got.get(r.partition, 0) + 1
    return got, time.monotonic() - t0


def test_a_first_answer_slower_than_idle_ms_is_waited_for() -> None:
    consumer = ScriptedConsumer({0: 250, 1: 40}, {0: 1.0, 1: 0.2})
    got, seconds = read_all(consumer, [0, 1], first_fetch_ms=5_000)
    assert got == {0: 250, 1: 40}  # before the fix: {1: 40}, partition 0 left unread
    assert seconds < 3  # it ended at the end-of-partition events, not at the patience limit


def test_a_partition_that_never_answers_ends_the_run_after_first_fetch_ms() -> None:
    consumer = ScriptedConsumer({0: 30, 1: 30}, {0: 0.0, 1: None})
    got, seconds = read_all(consumer, [0, 1], first_fetch_ms=1_500)
    assert got == {0: 30}
    assert 1.4 <= seconds < 4


def test_silence_after_every_partition_answered_ends_after_idle_ms() -> None:
    consumer = ScriptedConsumer({0: 30}, {0: 0.0})
    consumer.queue[0].pop()  # its end-of-partition event never comes
    got, seconds = read_all(consumer, [0], first_fetch_ms=60_000)
    assert got == {0: 30}
    assert seconds < 2  # idle_ms (300 ms), not first_fetch_ms
