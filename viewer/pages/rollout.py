"""/rollouts/{rollout_id}: one rollout (span tree, LLM calls, transitions' tokens, rewards, credit variants).

``?tenant=`` and ``?attempt=`` pick one row when the id has several (attempts, or the operator seeing
two tenants' rollouts with the same id). A rollout that is not in the visitor's scope is a 404.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from viewer.auth import request_scope
from viewer.errors import NotFound
from viewer.queries import filters as f
from viewer.queries.rollout import TransitionView, rollout_view
from viewer.templating import render


@dataclass(frozen=True)
class TokenCell:
    """One response token as drawn: its text, class (trained or masked), colour and hover text."""

    text: str
    css: str
    style: str
    title: str


def token_cells(t: TransitionView, scale: float) -> list[TokenCell]:
    """Trained tokens coloured by the transition's advantage (green above zero, red below, stronger with
    |advantage| / ``scale``); masked tokens (observations) grey; the logprob on hover."""
    adv = float(t.row.get("advantage") or 0.0)
    alpha = 0.12 + 0.6 * min(1.0, abs(adv) / scale) if scale > 0 else 0.12
    rgb = "22,163,74" if adv > 0 else "220,38,38" if adv < 0 else "148,163,184"
    out = []
    for tok in t.tokens:
        if tok.trained:
            lp = "logprob unknown" if tok.logprob is None else f"logprob {tok.logprob:.4f}"
            title = f"{lp} · trained · advantage {adv:+.4f}"
            out.append(TokenCell(tok.text, "tok", f"background: rgba({rgb},{alpha:.2f})", title))
        else:  # an observation (a tool result, the next user turn): not sampled, so no logprob of its own
            out.append(TokenCell(tok.text, "tok masked", "", "masked (observation): not trained"))
    return out


def _scale(variants: dict[str, list[TransitionView]]) -> float:
    return max((abs(float(t.row.get("advantage") or 0.0)) for ts in variants.values() for t in ts), default=1.0)


async def rollout_page(request: Request) -> Response:
    scope = request_scope(request)
    rollout_id = request.path_params["rollout_id"]
    f.only_known(request.query_params.keys(), ("tenant", "attempt"))  # a FilterError is a BadRequest: the 400 page
    tenant = f.text("tenant", request.query_params.get("tenant"))
    attempt = f.text("attempt", request.query_params.get("attempt"))
    if f.text("rollout id", rollout_id) is None:
        raise NotFound("an empty rollout id")
    rid = rollout_id  # as given: ids are matched exactly, spaces included
    view = rollout_view(request.app.state.lake, scope, rid, request.app.state.tokens, tenant=tenant, attempt=attempt)
    if view is None:
        raise NotFound(f"rollout {rid!r}")
    scale = _scale(view.variants) or 1.0
    cells = {name: [token_cells(t, scale) for t in ts] for name, ts in view.variants.items()}
    return render(
        request,
        "rollout.html",
        {"title": f"Rollout {rid}", "v": view, "t": view.trajectory, "cells": cells},
    )


routes: list[BaseRoute] = [Route("/rollouts/{rollout_id:path}", rollout_page)]
