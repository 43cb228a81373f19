"""The production-traffic demo's reward poster: a separate process posting rewards late, through a real collector."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from examples.closed_loop.late_rewards import LateRewards
from schemas.config import Settings
from tests.collectors.helpers import read_topic, running_collector, wait_until

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


def test_rewards_are_posted_after_their_delay_and_the_undue_ones_never(settings: Settings) -> None:
    with running_collector(settings) as server:
        sent_at = time.time()
        with LateRewards(f"http://127.0.0.1:{server.http_port}", cwd=REPO) as poster:
            poster.send("r-now", 1.0, 0.0)
            poster.send("r-soon", 0.0, 0.5)
            poster.send("r-later", 0.25, 2.0)
            poster.send("r-never", 1.0, 600.0)  # still waiting when the poster stops: never sent
            wait_until(lambda: len(poster.posted()) == 3, 60, "three rewards posted")
            assert poster.posted() == {"r-now", "r-soon", "r-later"} and poster.failed() == {}
        records = read_topic(settings.kafka, settings.kafka.rewards_topic, expect=3, idle=3.0)
    events = {json.loads(r.value)["rollout_id"]: (json.loads(r.value), r.timestamp / 1000) for r in records}
    assert set(events) == {"r-now", "r-soon", "r-later"}  # once each: r-never was not posted
    assert {k: e["value"] for k, (e, _) in events.items()} == {"r-now": 1.0, "r-soon": 0.0, "r-later": 0.25}
    assert events["r-later"][1] - sent_at >= 2.0  # not before its delay
    assert events["r-now"][0]["event_id"] == "late-r-now"  # a retried post is the same event
