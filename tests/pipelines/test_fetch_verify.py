"""``batches(verify=...)``: the check that the log still holds the lake's watermark records, done by the read itself.

Ingestion used to read the record at each watermark with a probe of its own and then read the
increment from the next offset: librdkafka fetched the increment twice (0.2 s of a 1.6 s run of 10,000
rollouts onto a grown lake, issue 28). Now the batches start at the watermark's record, compare its
fingerprint and drop it. These tests read a real broker's partitions with generated watermarks
(inside the log or past its end, with the right fingerprint or not) and compare with a plain read
from the offset after the watermark: the same records when every fingerprint matches, and
``LogNotVerified`` before any batch otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.bronze.decoding import KafkaRecord
from pipelines.bronze.fetch import LogNotVerified, batches, make_fetcher, topic_partitions
from pipelines.bronze.positions import record_fingerprint
from schemas.config import KafkaSettings
from tests.pipelines.otel import produce
from tests.topics import fresh_kafka

pytestmark = pytest.mark.kafka

RECORDS = 120


def _read(k: KafkaSettings, starts: dict[int, int | None], **kw: object) -> list[KafkaRecord]:
    consumer = make_fetcher(k)
    try:
        return [r for b in batches(consumer, k.spans_topic, starts, 25, 300, **kw) for r in b]  # type: ignore[arg-type]
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def log(kafka_bootstrap: str) -> Iterator[tuple[KafkaSettings, dict[int, list[KafkaRecord]]]]:
    """A topic of RECORDS records over 3 partitions, and each partition's records as a plain read gives them."""
    k = fresh_kafka(kafka_bootstrap, prefix="verify", partitions=3)
    produce(k, k.spans_topic, [{"key": f"k{i}".encode(), "value": b"v%d" % i, "headers": []} for i in range(RECORDS)])
    consumer = make_fetcher(k)
    try:
        parts = topic_partitions(consumer, k.spans_topic)
    finally:
        consumer.close()
    by_part: dict[int, list[KafkaRecord]] = {p: [] for p in parts}
    for r in _read(k, dict.fromkeys(parts)):
        by_part[r.partition].append(r)
    assert sum(map(len, by_part.values())) == RECORDS
    yield k, by_part


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), base=st.sampled_from([0, 1000]))
def test_a_verified_read_is_the_plain_read_after_the_watermarks(
    log: tuple[KafkaSettings, dict[int, list[KafkaRecord]]], data: st.DataObject, base: int
) -> None:
    k, by_part = log
    verify: dict[int, tuple[int, int]] = {}
    starts: dict[int, int | None] = {}
    bad: set[int] = set()
    for p, recs in by_part.items():
        # None: nothing held yet; an offset in the log; or one past its end (the log lost it)
        at = data.draw(st.one_of(st.none(), st.integers(0, len(recs) - 1), st.just(len(recs) + 5)), label=f"p{p}")
        if at is None:
            starts[p] = None
            continue
        right = data.draw(st.booleans(), label=f"fingerprint of p{p} right") if at < len(recs) else False
        fp = record_fingerprint(recs[at]) if at < len(recs) else 1
        verify[p] = (at + base, fp if right else fp ^ 1)
        starts[p] = at + 1
        if not right:
            bad.add(p)
    bases = dict.fromkeys(by_part, base)
    if bad:
        with pytest.raises(LogNotVerified) as err:
            _read(k, starts, bases=bases, verify=verify)
        assert set(err.value.partitions) <= bad
        return
    got = _read(k, starts, bases=bases, verify=verify)
    want = [r._replace(offset=r.offset + base) for r in _read(k, starts)]
    key = lambda r: (r.partition, r.offset)  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)


def test_nothing_is_yielded_before_every_watermark_matched(
    log: tuple[KafkaSettings, dict[int, list[KafkaRecord]]],
) -> None:
    """One partition's watermark record differs: no batch comes, even when the others' records fill several."""
    k, by_part = log
    first, *rest = sorted(by_part)
    verify = {p: (0, record_fingerprint(by_part[p][0])) for p in rest}
    verify[first] = (0, record_fingerprint(by_part[first][1]))  # the fingerprint of another record
    consumer = make_fetcher(k)
    try:
        stream = batches(consumer, k.spans_topic, dict.fromkeys(by_part, 1), 5, 300, verify=verify)
        with pytest.raises(LogNotVerified, match=f"partitions \\[{first}\\]: sent offset 0 first"):
            next(stream)
    finally:
        consumer.close()
