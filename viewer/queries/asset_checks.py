"""The asset checks' latest results, read from Dagster's webserver (its GraphQL API, over HTTP, read-only).

Dagster keeps check results in its own instance, not in the lake; the viewer asks the stack's webserver with one
query (each asset node's checks and the execution for its latest materialization) within a short deadline,
and the page says when Dagster is not there. The parsing is a pure function of the response's JSON.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

QUERY = """
query AgentlakeAssetChecks {
  assetNodes {
    assetKey { path }
    assetChecksOrError {
      __typename
      ... on AssetChecks {
        checks {
          name
          description
          executionForLatestMaterialization {
            runId
            status
            timestamp
            evaluation {
              timestamp
              success
              severity
              description
              metadataEntries {
                __typename
                label
                ... on TextMetadataEntry { text }
                ... on IntMetadataEntry { intValue }
                ... on FloatMetadataEntry { floatValue }
                ... on BoolMetadataEntry { boolValue }
                ... on UrlMetadataEntry { url }
                ... on JsonMetadataEntry { jsonString }
                ... on MarkdownMetadataEntry { mdStr }
                ... on PathMetadataEntry { path }
              }
            }
          }
        }
      }
      ... on AssetCheckNeedsMigrationError { message }
      ... on AssetCheckNeedsUserCodeUpgrade { message }
      ... on AssetCheckNeedsAgentUpgradeError { message }
    }
  }
}
"""

_VALUE_KEYS = ("text", "intValue", "floatValue", "boolValue", "url", "jsonString", "mdStr", "path")


@dataclass(frozen=True)
class CheckResult:
    """One asset check and its latest execution (``result`` "never run" when it has none)."""

    asset: str  # the asset key, its path joined by "/"
    check: str
    result: str  # passed, failed, warn, execution failed, in progress, skipped, never run
    when: dt.datetime | None
    description: str
    summary: str  # the evaluation's description and metadata, shortened
    run_id: str | None
    link: str  # the check on Dagster's UI


@dataclass(frozen=True)
class Checks:
    """The checks Dagster answered with, or why it did not."""

    checks: list[CheckResult]
    error: str | None = None


def _result(execution: dict[str, Any] | None) -> str:
    if not execution:
        return "never run"
    status = execution.get("status")
    ev = execution.get("evaluation") or {}
    if status == "SUCCEEDED" or (ev and ev.get("success")):
        return "passed"
    if status == "FAILED" or (ev and ev.get("success") is False):
        return "warn" if ev.get("severity") == "WARN" else "failed"
    return {"EXECUTION_FAILED": "execution failed", "IN_PROGRESS": "in progress", "SKIPPED": "skipped"}.get(
        str(status), str(status).lower()
    )


def _summary(ev: dict[str, Any], *, limit: int = 240) -> str:
    parts = [ev["description"]] if ev.get("description") else []
    for m in ev.get("metadataEntries") or []:
        value = next((m[k] for k in _VALUE_KEYS if m.get(k) is not None), None)
        if value is not None:
            parts.append(f"{m.get('label')}: {value}")
    text = "; ".join(str(p) for p in parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_checks(payload: dict[str, Any], dagster_base: str) -> Checks:
    """The checks of a response to ``QUERY``, sorted failed first, then by asset and name."""
    if payload.get("errors"):
        return Checks(
            [], "Dagster answered with errors: " + "; ".join(str(e.get("message")) for e in payload["errors"])
        )
    out = []
    problems = []
    for node in (payload.get("data") or {}).get("assetNodes") or []:
        path = node["assetKey"]["path"]
        asset = "/".join(path)
        checks = node.get("assetChecksOrError") or {}
        if checks.get("__typename") != "AssetChecks":
            if checks.get("message"):
                problems.append(f"{asset}: {checks['message']}")
            continue
        for c in checks.get("checks") or []:
            ex = c.get("executionForLatestMaterialization")
            ev = (ex or {}).get("evaluation") or {}
            ts = ev.get("timestamp") or (ex or {}).get("timestamp")
            link = f"{dagster_base}/assets/{'/'.join(quote(p, safe='') for p in path)}"
            link += f"?view=checks&checkDetail={quote(c['name'], safe='')}"
            out.append(
                CheckResult(
                    asset,
                    c["name"],
                    _result(ex),
                    dt.datetime.fromtimestamp(float(ts), dt.UTC) if ts else None,
                    c.get("description") or "",
                    _summary(ev),
                    (ex or {}).get("runId"),
                    link,
                )
            )
    order = {"failed": 0, "execution failed": 1, "warn": 2}
    out.sort(key=lambda r: (order.get(r.result, 3), r.asset, r.check))
    return Checks(out, "; ".join(problems) or None)


def fetch_checks(dagster_base: str, *, timeout_s: float = 1.0) -> Checks:
    """The checks from the webserver at ``dagster_base`` (its /graphql), or why there are none."""
    try:
        r = httpx.post(f"{dagster_base}/graphql", json={"query": QUERY}, timeout=timeout_s)
        r.raise_for_status()
        return parse_checks(r.json(), dagster_base)
    except (httpx.HTTPError, ValueError) as e:
        return Checks([], f"Dagster's webserver at {dagster_base} did not answer: {type(e).__name__}: {e}")
