"""The keys rows are matched and replaced by: every one of them starts with the tenant.

Two tenants may use the same rollout id, trace id, response id, event id or task id (ids are
chosen by agents, and a tenant can guess or copy another's); only the tenant, which the collector
stamps from the bearer token, tells them apart. So nothing here takes an id without its tenant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import polars as pl

from schemas.lake import sql_string
from schemas.topics import DEFAULT_TENANT

ROLLOUT = ["tenant", "rollout_id"]
ATTEMPT = ["tenant", "rollout_id", "attempt_id"]
TRACE = ["tenant", "trace_id"]
GROUP = ["tenant", "group_id"]

Key = tuple[str, str]  # (tenant, id)


def frame(pairs: Iterable[Key], column: str) -> pl.DataFrame:
    """``pairs`` as a two-column frame (``tenant``, ``column``), for semi-joins."""
    rows = sorted(set(pairs))
    return pl.DataFrame(
        {"tenant": [t for t, _ in rows], column: [x for _, x in rows]},
        schema={"tenant": pl.String, column: pl.String},
    )


def among(pairs: Iterable[Key], column: str) -> pl.Expr:
    """Rows whose (``tenant``, ``column``) is one of ``pairs``: a coarse id filter that Delta scans
    can push down, refined per tenant (follow it with ``keep``)."""
    rows = set(pairs)
    return pl.col("tenant").is_in(sorted({t for t, _ in rows})) & pl.col(column).is_in(sorted({x for _, x in rows}))


def keep(df: pl.DataFrame, pairs: Iterable[Key], column: str) -> pl.DataFrame:
    """The rows of ``df`` whose (``tenant``, ``column``) is exactly one of ``pairs``."""
    return df.join(frame(pairs, column), on=["tenant", column], how="semi")


# Longest ``IN`` list left for delta-rs to check against file statistics. DataFusion prunes files by
# the min/max of a short list only, yet still checks a long one against every file of the table, even
# those a ``day`` bound has already pruned: 10,000 ids cost up to 0.03 s per file (deltalake 1.6; less
# once a checkpoint holds the statistics), so a replacement's cost grew with the table. Wrapped in
# ``concat`` the column has no statistics to check: the files left after partition pruning are read
# and the list is matched as a hash set.
PRUNED_IN_LIST = 20


def predicate(pairs: Iterable[Key], column: str) -> str:
    """A Delta predicate for the rows of these (tenant, id) pairs: one ``IN`` list per tenant."""
    by_tenant: dict[str, list[str]] = {}
    for tenant, value in sorted(set(pairs)):
        by_tenant.setdefault(tenant, []).append(value)
    parts = [
        f"(tenant = {sql_string(t)} AND {_matched(column, values)} IN ({', '.join(sql_string(v) for v in values)}))"
        for t, values in by_tenant.items()
    ]
    return " OR ".join(parts) if parts else "false"


def _matched(column: str, values: list[str]) -> str:
    """``column`` as the ``IN`` list of ``values`` should test it (see ``PRUNED_IN_LIST``)."""
    return column if len(values) <= PRUNED_IN_LIST else f"concat({column}, '')"


def _escaped(tenant: pl.Expr) -> pl.Expr:
    """The tenant with ``%``, ``/`` and ``@`` escaped, so it can open or close an id unambiguously."""
    out = tenant.str.replace_all("%", "%25", literal=True)
    return out.str.replace_all("/", "%2F", literal=True).str.replace_all("@", "%40", literal=True)


def attempt_key() -> pl.Expr:
    """One string per (tenant, rollout, attempt): ``tenant/rollout/attempt``, the tenant escaped."""
    return pl.concat_str(
        [_escaped(pl.col("tenant")), pl.col("rollout_id"), pl.col("attempt_id").fill_null("")], separator="/"
    )


def transition_id(columns: Sequence[str] = ("tenant", "rollout_id", "attempt_id", "step")) -> pl.Expr:
    """``rollout/attempt/step``, with ``@tenant`` after it for every tenant but the default one.

    The default tenant's ids are what they were before tenants were keys (the trainer's lineage of
    what it already trained on stays valid). Another tenant's id cannot equal one of them, nor one
    of a third tenant's: an id's last ``/`` part is the step alone for the default tenant, and
    ``step@tenant`` otherwise, with ``/``, ``@`` and ``%`` escaped in the tenant.
    """
    tenant, rollout, attempt, step = (pl.col(c) for c in columns)
    base = pl.concat_str([rollout, attempt.fill_null(""), step.cast(pl.String)], separator="/")
    return (
        pl.when(tenant == DEFAULT_TENANT).then(base).otherwise(pl.concat_str([base, _escaped(tenant)], separator="@"))
    )
