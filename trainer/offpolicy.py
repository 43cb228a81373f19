"""Off-policy data: how far behind a transition's policy is, which rows are too stale, and what TIS did.

Every transition carries ``policy_version``, the served model the gateway recorded for its call:
``<served name>@<version folder>`` for an adapter (``agentlake-policy@v0003``), or a bare name.
Its *source* is the version part (``v0003``); its *staleness* is how many registry versions it is
behind the version a round trains from (``v0005`` - ``v0003`` = 2). A source that is no registry
version (the base model's name, a missing value) or one ahead of the trained-from version has no
staleness: it is "unknown", kept, and corrected like any stale row.

With policy lines (``trainer.lines``) version names are one sequence across the lines, so the round of
a line counts that line's versions only (``line_versions``, its versions oldest first: the registry's
rows of that agent): a planner row one planner version behind is 1 stale however many solver versions
came in between, and a source that is no version of the line has no staleness.

A round (``trainer.round``) skips rows more than ``max_staleness`` versions behind, counting them per
source. The loop (``trainer.train``) then treats a row as on-policy when its source is the version it
trains from, and every other row as stale: for those it computes the proximal logprobs (the weights
at the start of the round, no grad), and the loss weights each token by the truncated importance
ratio ``min(pi_old / pi_behaviour, C)`` (``trainer.losses``). ``source_stats`` summarises, per
source, the tokens, the mean untruncated ratio, the fraction of tokens capped at C and the rows
without behaviour logprobs (which no weight can correct); the round writes it into
``model_versions.metrics`` under ``offpolicy``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import pyarrow as pa

if TYPE_CHECKING:  # trainer.data imports torch; the version rules are read where torch is not (pipelines.defs.checks)
    from trainer.data import Example

_VERSION = re.compile(r"v(\d+)")
UNKNOWN = "unknown"  # the source of a row with no policy_version


def source_of(policy_version: str | None) -> str:
    """The version part of a recorded policy version: ``agentlake-policy@v0003`` -> ``v0003``."""
    if not policy_version:
        return UNKNOWN
    return policy_version.rsplit("@", 1)[-1]


def version_number(source: str | None) -> int | None:
    """The registry number of a version name (``v0003`` -> 3); None for anything else."""
    m = _VERSION.fullmatch(source or "")
    return int(m.group(1)) if m else None


def staleness(
    policy_version: str | None, current_version: str | None, *, line_versions: Sequence[str] | None = None
) -> int | None:
    """Versions between the row's policy and ``current_version`` (None: the base model, number 0).

    ``line_versions``: count only these, a policy line's versions oldest first; None: every registry
    version (the single policy). None when it cannot be told: the row's source is no registry version
    (or none of the line's), or is ahead of the current one.
    """
    if line_versions is None:
        behind = version_number(source_of(policy_version))
        now = version_number(current_version) if current_version else 0
    else:
        position = {v: k for k, v in enumerate(line_versions, start=1)}
        behind = position.get(source_of(policy_version))
        now = position.get(current_version) if current_version else 0
    if behind is None or now is None or behind > now:
        return None
    return now - behind


def is_on_policy(policy_version: str | None, current_version: str | None) -> bool:
    """Whether the row was sampled from the very policy a round starts from (no correction needed)."""
    return staleness(policy_version, current_version) == 0


def tis_enabled(tis_cap: float | None) -> TypeGuard[float]:
    return tis_cap is not None and tis_cap > 0


def split_stale(
    rows: pa.Table,
    *,
    current_version: str | None,
    max_staleness: int | None,
    line_versions: Sequence[str] | None = None,
) -> tuple[pa.Table, dict[str, int]]:
    """(rows to train on, rows skipped per source): rows more than ``max_staleness`` versions (of the line,
    when ``line_versions`` is given) behind go."""
    if max_staleness is None or rows.num_rows == 0:
        return rows, {}
    keep: list[bool] = []
    skipped: dict[str, int] = {}
    for pv in rows["policy_version"].to_pylist():
        d = staleness(pv, current_version, line_versions=line_versions)
        ok = d is None or d <= max_staleness
        keep.append(ok)
        if not ok:
            skipped[source_of(pv)] = skipped.get(source_of(pv), 0) + 1
    return rows.filter(pa.array(keep, pa.bool_())), skipped


def source_stats(
    examples: Sequence[Example], *, current_version: str | None, tis_cap: float | None
) -> dict[str, dict[str, Any]]:
    """Per source version: rows, trained tokens, and with TIS on the ratio pi_old / pi_behaviour's
    mean, the fraction of tokens capped at C, and the mean weight, over trained tokens whose
    behaviour and proximal logprobs are both known; rows without behaviour logprobs are ``uncorrected_rows``."""
    acc: dict[str, dict[str, float]] = {}
    for ex in examples:
        src = source_of(ex.policy_version)
        a = acc.setdefault(src, {"rows": 0, "tokens": 0, "ratio_tokens": 0, "ratio_sum": 0.0, "capped": 0, "w": 0.0})
        a["rows"] += 1
        a["tokens"] += sum(ex.loss_mask)
        if ex.old_logprobs is None:
            a["uncorrected_rows"] = a.get("uncorrected_rows", 0) + 1
            continue
        if not tis_enabled(tis_cap):
            continue
        prox = ex.prox_logprobs if ex.prox_logprobs is not None else ex.old_logprobs  # on-policy: the same
        for m, lp_old, lp_beh in zip(ex.loss_mask, prox, ex.old_logprobs, strict=True):
            if not m:
                continue
            ratio = math.exp(lp_old - lp_beh)
            a["ratio_tokens"] += 1
            a["ratio_sum"] += ratio
            a["capped"] += ratio > tis_cap
            a["w"] += min(ratio, tis_cap)
    out: dict[str, dict[str, Any]] = {}
    for src, a in sorted(acc.items()):
        n = a["ratio_tokens"]
        stats: dict[str, Any] = {
            "rows": int(a["rows"]),
            "tokens": int(a["tokens"]),
            "staleness": _source_staleness(src, current_version, None),
            "uncorrected_rows": int(a.get("uncorrected_rows", 0)),
        }
        if n:
            stats.update(ratio_mean=a["ratio_sum"] / n, clip_frac=a["capped"] / n, weight_mean=a["w"] / n)
        out[src] = stats
    return out


def _source_staleness(src: str, current_version: str | None, line_versions: Sequence[str] | None) -> int | None:
    return staleness(src if src != UNKNOWN else None, current_version, line_versions=line_versions)


def with_skipped(
    stats: dict[str, dict[str, Any]],
    skipped: dict[str, int],
    *,
    current_version: str | None,
    line_versions: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """What a round records: ``stats`` (``source_stats``) plus each source's ``skipped_stale`` count (0 where
    none was skipped), every source's ``staleness`` counted as the round's skip counted it: in
    ``line_versions`` for a line's round, where the loop's count (every registry version) would be wrong."""
    out: dict[str, dict[str, Any]] = {}
    for src in sorted({*stats, *skipped}):
        empty = {"rows": 0, "tokens": 0, "uncorrected_rows": 0}
        out[src] = {
            **stats.get(src, empty),
            "staleness": _source_staleness(src, current_version, line_versions),
            "skipped_stale": skipped.get(src, 0),
        }
    return out
