"""Reading query-string values into typed values, each failure a ``FilterError`` that names the parameter.

One module for every page's parameters, so a visitor reads one wording everywhere: ``name: 'value' ...``.
A ``FilterError`` is a ``BadRequest``, which the app turns into a 400 page with its reason; nothing a visitor
types reaches SQL text (values go in as DuckDB parameters, names through fixed allow-lists).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Collection

from viewer.errors import BadRequest

MAX_TEXT = 256  # an id, a task, an agent name: longer is a mistake (or an attack), not a filter
MAX_PAGE = 1_000_000


class FilterError(BadRequest, ValueError):
    """A query parameter that is not valid; the message names it and says what is accepted."""


def invalid(name: str, value: str, takes: str) -> FilterError:
    """The error for parameter ``name``: what was given and what it takes."""
    shown = value if len(value) <= 80 else value[:77] + "..."
    return FilterError(f"{name}: {shown!r} is not valid; {name} takes {takes}")


def page_number(value: str | None) -> int:
    """A 1-based page number (absent: 1)."""
    return integer("page", value, default=1, low=1, high=MAX_PAGE)


def text(name: str, value: str | None) -> str | None:
    """A free-text filter (exact match): stripped; empty means unset."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if len(value) > MAX_TEXT:
        raise FilterError(f"{name}: at most {MAX_TEXT} characters")
    if "\x00" in value:
        raise FilterError(f"{name}: must not contain NUL characters")
    return value


def number(name: str, value: str | None) -> float | None:
    """A finite number; empty means unset."""
    raw = text(name, value)
    if raw is None:
        return None
    try:
        out = float(raw)
    except ValueError:
        raise FilterError(f"{name}: {raw!r} is not a number") from None
    if not math.isfinite(out):
        raise FilterError(f"{name}: {raw!r} is not a finite number")
    return out


def integer(name: str, value: str | None, *, default: int, low: int, high: int) -> int:
    """An integer in [low, high]; empty means ``default``."""
    raw = text(name, value)
    if raw is None:
        return default
    try:
        out = int(raw)
    except ValueError:
        raise FilterError(f"{name}: {raw!r} is not a whole number") from None
    if not low <= out <= high:
        raise FilterError(f"{name}: {out} is not between {low} and {high}")
    return out


def timestamp(name: str, value: str | None) -> dt.datetime | None:
    """An ISO 8601 date or date-time (UTC unless it says otherwise); empty means unset."""
    raw = text(name, value)
    if raw is None:
        return None
    try:
        out = dt.datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
    except ValueError:
        raise FilterError(
            f"{name}: {raw!r} is not an ISO date or date-time (e.g. 2026-11-26 or 2026-11-26T08:30)"
        ) from None
    if out.tzinfo is None:
        out = out.replace(tzinfo=dt.UTC)
    if not dt.datetime(1970, 1, 1, tzinfo=dt.UTC) <= out <= dt.datetime(9000, 1, 1, tzinfo=dt.UTC):
        raise FilterError(f"{name}: {raw!r} is out of range")
    return out.astimezone(dt.UTC)


def choice(name: str, value: str | None, allowed: Collection[str], *, default: str | None = None) -> str | None:
    """One of ``allowed``; empty means ``default``."""
    raw = text(name, value)
    if raw is None:
        return default
    if raw not in allowed:
        raise FilterError(f"{name}: {raw!r} is not one of {', '.join(sorted(allowed))}")
    return raw


def only_known(params: Collection[str], known: Collection[str]) -> None:
    """A parameter the page does not take is an error (a typo would otherwise filter nothing, silently)."""
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise FilterError(f"unknown parameter {unknown[0]!r}: this page takes {', '.join(sorted(known))}")
