"""/rollouts over a lake the pipeline built: filters, sort, stable pages, id search, 400 for bad values."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from tests.viewer.lake import SPECS, when
from viewer.queries.rollouts import PARAMS

ALL = sorted((s.tenant, s.rollout_id) for s in SPECS)


def listed(html: str) -> list[tuple[str, str]]:
    """(tenant, rollout id) of each row of the rollouts table, in page order."""
    return re.findall(r'<tr data-tenant="([^"]*)" data-rollout="([^"]*)">', html)


def get(client: TestClient, **params: object) -> list[tuple[str, str]]:
    page = client.get("/rollouts", params={k: str(v) for k, v in params.items()})
    assert page.status_code == 200, page.text
    return listed(page.text)


def test_the_list_shows_every_rollout_newest_first(client: TestClient) -> None:
    page = client.get("/rollouts")
    assert page.status_code == 200
    rows = listed(page.text)
    assert rows == [(s.tenant, s.rollout_id) for s in reversed(SPECS)]  # started one minute apart
    assert 'href="/rollouts/r1"' in page.text and 'href="/versions/v0002"' in page.text


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"agent": "critic"}, [("default", "r2")]),
        ({"task": "a"}, [("acme", "a0"), ("default", "r0"), ("default", "r1"), ("default", "r2")]),
        ({"tenant": "acme"}, [("acme", "a0"), ("acme", "a1"), ("acme", "r0")]),
        ({"reward_min": "0.5", "reward_max": "0.9"}, [("acme", "a1"), ("default", "r2")]),
        ({"policy_version": "v0002"}, [("default", "r3")]),  # the registry's spelling
        ({"policy_version": "agentlake-policy@v0002"}, [("default", "r3")]),  # the recorded one
        ({"status": "finished"}, ALL),
        ({"status": "failed"}, []),
        ({"since": when(2).isoformat(), "until": when(4).isoformat()}, [("default", "r2"), ("default", "r3")]),
        ({"q": "r1"}, [("default", "r1")]),
        ({"q": "r0"}, [("acme", "r0"), ("default", "r0")]),
        ({"q": "resp-a1-None-0"}, [("acme", "a1")]),  # an LLM response id
        ({"agent": "solver", "task": "b"}, [("default", "r3")]),
    ],
)
def test_filters(client: TestClient, params: dict[str, str], expected: list[tuple[str, str]]) -> None:
    assert sorted(get(client, **params)) == expected


def test_search_by_trace_id(client: TestClient, viewer_lake: object) -> None:
    import polars as pl

    from schemas.lake import Lake

    assert isinstance(viewer_lake, Lake)
    row = pl.read_delta(viewer_lake.uri("trajectories")).filter(pl.col("rollout_id") == "a0").row(0, named=True)
    assert get(client, q=row["trace_ids"][0]) == [("acme", "a0")]


def test_sort_by_reward_and_stable_pages(client: TestClient) -> None:
    by_reward = get(client, sort="reward", order="asc")
    rewards = {(s.tenant, s.rollout_id): s.reward for s in SPECS}
    assert [rewards[r] for r in by_reward] == sorted(rewards.values())
    # ties (r0 and r3 both 1.0) break by tenant then id, so pages never repeat or skip a row
    pages = [get(client, sort="reward", order="desc", per_page=2, page=p) for p in range(1, 6)]
    assert [len(p) for p in pages] == [2, 2, 2, 1, 0]
    flat = [r for p in pages for r in p]
    assert flat == get(client, sort="reward", order="desc") and len(set(flat)) == len(SPECS)
    second = client.get("/rollouts", params={"sort": "reward", "per_page": "2", "page": "2"}).text
    assert 'rel="next"' in second and 'rel="prev"' in second and "page=3" in second


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"reward_min": "abc"}, "reward_min: &#39;abc&#39; is not a number"),
        ({"reward_max": "nan"}, "reward_max: &#39;nan&#39; is not a finite number"),
        ({"reward_min": "2", "reward_max": "1"}, "reward_min (2.0) is above reward_max (1.0)"),
        ({"since": "yesterday"}, "since: &#39;yesterday&#39; is not an ISO date"),
        ({"status": "done"}, "status: &#39;done&#39; is not one of"),
        ({"sort": "1; DROP TABLE trajectories"}, "sort: "),
        ({"page": "0"}, "page: 0 is not between 1 and"),
        ({"per_page": "x"}, "per_page: &#39;x&#39; is not a whole number"),
        ({"rewardmin": "1"}, "unknown parameter &#39;rewardmin&#39;"),
        ({"q": "x" * 300}, "q: at most 256 characters"),
    ],
)
def test_bad_filter_values_are_a_400_with_the_reason(client: TestClient, params: dict[str, str], reason: str) -> None:
    page = client.get("/rollouts", params=params)
    assert page.status_code == 400
    assert reason in page.text and "<h1>Bad request</h1>" in page.text


_text = st.text(max_size=40) | st.sampled_from(["", "-1", "0", "1e309", "2026-13-01", "NaN", "' OR 1=1 --", "\x00"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.dictionaries(st.sampled_from(PARAMS) | st.text(max_size=8), _text, max_size=5))
def test_junk_query_strings_are_never_a_500(client: TestClient, query: dict[str, str]) -> None:
    page = client.get("/rollouts", params=query)
    assert page.status_code in (200, 400), (query, page.text[:500])
    assert ("<h1>Bad request</h1>" in page.text) == (page.status_code == 400)
