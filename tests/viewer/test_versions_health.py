"""The versions and health pages over a lake the real pipeline built (tests/viewer/versions_lake.py), driven
over HTTP: what each page shows, its 404 and 400 answers, and that a tenant token sees only its tenant's
rollouts and rewards there too."""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from schemas.config import load_settings
from schemas.lake import Lake
from tests.viewer.versions_lake import KAFKA, NOW, TRACKING, A, B, build
from viewer.app import create_app
from viewer.auth import OPERATOR, Scope
from viewer.lake import ViewerLake
from viewer.queries import health as h
from viewer.queries import versions as q

TOKENS = {"tok-a": A, "tok-b": B}
ADMIN = "tok-admin"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    return build(tmp_path_factory.mktemp("viewer") / "lake")


@pytest.fixture(scope="module")
def client(lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    state = tmp_path_factory.mktemp("state")
    settings = load_settings(
        environ={},
        overrides={
            "state": {"dir": str(state)},
            "collector": {"auth_tokens": TOKENS},
            "gateway": {"admin_token": ADMIN},
            "kafka": {"spans_topic": KAFKA.spans_topic, "rewards_topic": KAFKA.rewards_topic},
        },
    )
    with TestClient(create_app(settings, lake)) as c:
        yield c


def get(client: TestClient, path: str, token: str = ADMIN) -> object:
    return client.get(path, headers={"Authorization": f"Bearer {token}"})


def svg_text(html: str) -> list[str]:
    """The SVG documents the page embeds (as base64 data URIs)."""
    return [base64.b64decode(m).decode() for m in re.findall(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", html)]


# --- queries ---------------------------------------------------------------------------------------


def test_reward_over_time_per_version_and_agent_matches_the_trajectories(lake: Lake) -> None:
    vl = ViewerLake(lake)
    traj = pl.read_delta(lake.uri("trajectories")).filter(pl.col("final_reward").is_not_null())
    by_version = q.reward_over_time(vl, OPERATOR, by="version", bucket="day")
    expected = (
        traj.explode("policy_versions")
        # recorded as agentlake-policy@v0001; plotted under the registry's v0001
        .with_columns(pl.col("policy_versions").str.split("@").list.last())
        .group_by(pl.col("end_time").dt.truncate("1d").alias("bucket"), pl.col("policy_versions").alias("key"))
        .agg(pl.len().alias("n"), pl.col("final_reward").mean().alias("mean"))
        .sort("bucket", "key")
    )
    got = by_version.select("bucket", "key", "n", "mean").with_columns(pl.col("n").cast(pl.UInt32))
    assert got.to_dicts() == expected.with_columns(pl.col("bucket").dt.cast_time_unit("us")).to_dicts()
    # the interval is the normal one of the mean; one rollout has none
    day0 = by_version.filter(pl.col("key") == "v0001").row(0, named=True)
    assert day0["n"] == 3 and day0["low"] < day0["mean"] < day0["high"]
    assert by_version.filter(pl.col("n") == 1)["low"].is_null().all()
    # a tenant: only its rows (team-b's rewards are all 0.0; 2026-03-01 is a Sunday: two weeks)
    mine = q.reward_over_time(vl, Scope(tenant=B, operator=False), by="agent", bucket="week")
    assert set(mine["key"]) == {"spy"} and mine["n"].sum() == 3 and set(mine["mean"]) == {0.0}
    assert mine["bucket"].to_list() == [dt.datetime(2026, 2, 23, tzinfo=dt.UTC), dt.datetime(2026, 3, 2, tzinfo=dt.UTC)]
    theirs = q.reward_over_time(vl, Scope(tenant=A, operator=False), by="agent", bucket="day", sampled_by="v0002")
    assert set(theirs["key"]) == {"solver"} and theirs["mean"].to_list() == [1.0, 1.0]


def test_version_detail_lineage_and_tenant_scoped_rollouts(lake: Lake) -> None:
    vl = ViewerLake(lake)
    d = q.version_detail(vl, OPERATOR, "v0002")
    assert d is not None
    assert [a["version"] for a in d.ancestors] == ["v0001"] and [x["version"] for x in d.descendants] == ["v0003"]
    assert d.n_rollouts == 3 and d.n_transitions == 4
    assert sorted(zip(d.rollouts["tenant"], d.rollouts["rollout_id"], strict=True)) == [
        (A, "a-r2"),
        (A, "a-r3"),
        (B, "b-r1"),
    ]
    assert d.rollouts.filter(pl.col("rollout_id") == "a-r3")["transitions"].item() == 2
    assert d.evaluations["verdict"].to_list() == ["gain beyond noise"]
    b = q.version_detail(vl, Scope(tenant=B, operator=False), "v0002")
    assert b is not None and b.rollouts["rollout_id"].to_list() == ["b-r1"] and b.n_transitions == 1
    assert q.version_detail(vl, OPERATOR, "v0099") is None


def test_ingest_positions_and_left_out_counts(lake: Lake) -> None:
    vl = ViewerLake(lake)
    (spans, rewards) = h.ingest_positions(vl, KAFKA)
    # offsets 0..8 hold the rollouts; the junk record at 9 went to `quarantine` with that table's own watermark
    assert [(p.topic, p.partition, p.watermark) for p in spans.partitions] == [("s", 0, 8)]
    assert rewards.version is None and rewards.partitions == []
    credit = load_settings(environ={}).credit
    counts = {c.label: c.n for c in h.left_out(vl, OPERATOR, credit, NOW)}
    assert counts["waiting for a reward"] == 1 and counts["quarantined"] == 1 and counts["running"] == 0
    tenant = {c.label: c.n for c in h.left_out(vl, Scope(tenant=B, operator=False), credit, NOW)}
    assert tenant["waiting for a reward"] == 0 and "quarantined" not in tenant


# --- pages -----------------------------------------------------------------------------------------


def test_versions_page_lists_versions_with_evaluations_and_plots(client: TestClient) -> None:
    page = get(client, "/versions")
    assert page.status_code == 200, page.text
    for v in ("v0001", "v0002", "v0003"):
        assert f'href="/versions/{v}"' in page.text
    assert "0.620 [0.550, 0.700]" in page.text and "gain beyond noise" in page.text
    assert f'href="{TRACKING}"' in page.text
    svgs = svg_text(page.text)
    assert len(svgs) == 2 and all("mean final reward" in s and "rollout end" in s for s in svgs)
    published = get(client, "/versions?status=published&bucket=week")
    assert published.status_code == 200 and "/versions/v0003" not in published.text


def test_version_page_shows_lineage_rollouts_evaluations_and_tracker_run(client: TestClient) -> None:
    page = get(client, "/versions/v0002")
    assert page.status_code == 200, page.text
    text = page.text
    assert 'href="/versions/v0001"' in text and 'href="/versions/v0003"' in text  # came from, went to
    for rid, tenant in (("a-r2", A), ("a-r3", A), ("b-r1", B)):
        assert f'href="/rollouts/{rid}?tenant={tenant}"' in text
    assert "0.620 [0.550, 0.700]" in text and "+0.220 [+0.120, +0.310]" in text
    assert f'href="{TRACKING}"' in text and "/lake/transitions</code>" in text
    assert len(svg_text(text)) == 2


def test_unknown_version_is_404_and_bad_params_are_400_with_the_reason(client: TestClient) -> None:
    missing = get(client, "/versions/v0099")
    assert missing.status_code == 404 and "v0099" in missing.text
    for path, name in (
        ("/versions?status=shipped", "status"),
        ("/versions?page=0", "page"),
        ("/versions?page=abc", "page"),
        ("/versions?bucket=fortnight", "bucket"),
        ("/versions/v0002?page=-1", "page"),
        ("/health?bucket=1d", "bucket"),
        ("/versions/bad%20name", "version"),
    ):
        r = get(client, path)
        assert r.status_code == 400, (path, r.status_code)
        assert f"{name}: " in r.text, r.text  # one wording on every page (viewer/queries/filters.py)


def test_health_page_shows_watermarks_counts_and_where_the_checks_are(client: TestClient) -> None:
    page = get(client, "/health")
    assert page.status_code == 200, page.text
    text = page.text
    assert "watermark" in text and "<code>s</code>" in text and "No end offsets:" in text
    assert "quarantined" in text and "waiting for a reward" in text
    assert 'class="dagster" href="http://127.0.0.1:3000/assets"' in text
    (svg,) = svg_text(text)
    assert "mean final reward" in svg


def test_a_tenant_sees_only_its_rollouts_and_rewards_on_these_pages(client: TestClient) -> None:
    version = get(client, "/versions/v0002", token="tok-b")
    assert version.status_code == 200
    assert 'href="/rollouts/b-r1?tenant=team-b"' in version.text
    assert "a-r2" not in version.text and "a-r3" not in version.text
    assert "/lake/transitions</code>" not in version.text  # how much every tenant gave it is the operator's
    health = get(client, "/health", token="tok-b")
    assert health.status_code == 200
    (svg,) = svg_text(health.text)
    assert "spy" in svg and "solver" not in svg and "critic" not in svg  # only team-b's agent's line
    assert "end offset" not in health.text and "Newest quarantined" not in health.text
    assert "No check results" not in health.text and "operator's token shows them" in health.text
    plots = svg_text(get(client, "/versions", token="tok-b").text)
    assert all("solver" not in s for s in plots)
    assert get(client, "/versions").status_code == 200
    assert client.get("/versions").status_code == 401  # tokens configured: no token, no page


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(["page", "status", "bucket", "agent"]),
    value=st.text(max_size=30),
    path=st.sampled_from(["/versions", "/versions/v0002", "/health"]),
)
def test_any_query_value_is_a_page_or_a_400_never_a_500(client: TestClient, name: str, value: str, path: str) -> None:
    r = client.get(path, params={name: value}, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code in (200, 400), (path, name, value, r.status_code)
    if r.status_code == 400:
        assert f"{name}: " in r.text, r.text  # one wording on every page (viewer/queries/filters.py)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(version=st.text(min_size=1, max_size=40).filter(lambda v: v not in ("v0001", "v0002", "v0003", ".", "..")))
def test_any_unknown_version_is_a_404_or_a_400(client: TestClient, version: str) -> None:
    """("." and ".." are not names: the client resolves them as path steps, as a browser does.)"""
    r = client.get("/versions/" + quote(version, safe=""), headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code in (400, 404), (version, r.status_code)


def test_an_empty_lake_serves_these_pages_and_404s_every_version(tmp_path: Path) -> None:
    settings = load_settings(environ={}, overrides={"state": {"dir": str(tmp_path / "state")}})
    with TestClient(create_app(settings, Lake(str(tmp_path / "lake")))) as c:
        versions = c.get("/versions")
        assert versions.status_code == 200 and "No model versions yet" in versions.text
        health = c.get("/health")
        assert health.status_code == 200 and "nothing ingested yet" in health.text
        assert "no rollouts with a final reward" in svg_text(health.text)[0]
        assert c.get("/versions/v0001").status_code == 404
