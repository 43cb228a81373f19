"""Tenancy: with tokens configured the viewer asks for one; a tenant token sees only its tenant's rows,
the operator token all; anonymous visitors only while no token is configured (then loopback only)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from tests.viewer.conftest import OPERATOR_TOKEN, OTHER_TENANT_TOKEN, TENANT_TOKEN, viewer_settings
from tests.viewer.lake import SPECS
from tests.viewer.test_rollouts import listed
from viewer.auth import OPERATOR, Scope, Unauthenticated, ViewerAuth, must_bind_loopback

Secured = Callable[[], TestClient]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("path", ["/rollouts", "/rollouts/r0", "/rollouts/a0"])
def test_without_a_token_the_viewer_asks_for_one(secured: Secured, path: str) -> None:
    page = secured().get(path)
    assert page.status_code == 401 and '<form method="post" action="/login"' in page.text
    assert page.headers["www-authenticate"].startswith("Bearer")
    assert "a0" not in listed(page.text)
    assert secured().get(path, headers=bearer("wrong")).status_code == 401


def test_a_tenant_token_sees_only_its_tenants_rollouts(secured: Secured) -> None:
    client = secured()
    acme = [("acme", s.rollout_id) for s in reversed(SPECS) if s.tenant == "acme"]
    assert listed(client.get("/rollouts", headers=bearer(TENANT_TOKEN)).text) == acme
    # filters and search cannot reach another tenant: asking for it finds nothing
    assert listed(client.get("/rollouts?tenant=default", headers=bearer(TENANT_TOKEN)).text) == []
    assert listed(client.get("/rollouts?q=r1", headers=bearer(TENANT_TOKEN)).text) == []
    # default's rollouts are not there for acme (404, as if missing); acme's own r0 is acme's row
    assert client.get("/rollouts/r1", headers=bearer(TENANT_TOKEN)).status_code == 404
    assert client.get("/rollouts/r0?tenant=default", headers=bearer(TENANT_TOKEN)).status_code == 404
    own = client.get("/rollouts/r0", headers=bearer(TENANT_TOKEN))
    assert own.status_code == 200 and "<td>acme</td>" in own.text and "0.1000" in own.text
    assert "?tenant=default" not in own.text and "tenant <b>acme</b>" in own.text
    assert "r0 checked the tool" not in own.text  # default's judgement of its own r0
    # the other tenant sees its own and none of acme's
    mine = listed(client.get("/rollouts", headers=bearer(OTHER_TENANT_TOKEN)).text)
    assert {t for t, _ in mine} == {"default"} and len(mine) == 4


def test_the_operator_token_sees_every_tenant(secured: Secured) -> None:
    rows = listed(secured().get("/rollouts", headers=bearer(OPERATOR_TOKEN)).text)
    assert sorted(rows) == sorted((s.tenant, s.rollout_id) for s in SPECS)


def test_the_login_form_keeps_the_token_in_a_cookie(secured: Secured) -> None:
    client = secured()
    bad = client.post("/login", data={"token": "nope", "next": "/rollouts"}, follow_redirects=False)
    assert bad.status_code == 401 and "unknown token" in bad.text
    ok = client.post("/login", data={"token": TENANT_TOKEN, "next": "/rollouts/a0"}, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == "/rollouts/a0"
    assert "httponly" in ok.headers["set-cookie"].lower()
    assert client.get("/rollouts/a0").status_code == 200  # the cookie now
    assert {t for t, _ in listed(client.get("/rollouts").text)} == {"acme"}
    away = client.post("/login", data={"token": TENANT_TOKEN, "next": "//evil.example"}, follow_redirects=False)
    assert away.headers["location"] == "/rollouts"  # no redirect off the site
    client.get("/logout")
    assert client.get("/rollouts").status_code == 401


def test_anonymous_only_while_no_token_is_configured(tmp_path: Path, client: TestClient) -> None:
    anonymous = viewer_settings(tmp_path)
    assert ViewerAuth(anonymous).scope_for_token(None) == OPERATOR and must_bind_loopback(anonymous)
    assert re.search(r"operator", client.get("/rollouts").text)
    for overrides in ({"collector": {"auth_tokens": {"t": "acme"}}}, {"gateway": {"admin_token": "adm"}}):
        s = viewer_settings(tmp_path, **overrides)  # type: ignore[arg-type]
        assert not must_bind_loopback(s)
        with pytest.raises(Unauthenticated):
            ViewerAuth(s).scope_for_token(None)
    tenant_only = ViewerAuth(viewer_settings(tmp_path, collector={"auth_tokens": {"t": "acme"}}))
    assert tenant_only.scope_for_token("t") == Scope(tenant="acme", operator=False)
    with pytest.raises(Unauthenticated):
        tenant_only.scope_for_token("")  # an empty admin token is no token
