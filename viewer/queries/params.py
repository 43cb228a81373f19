"""Query-string values the versions and health pages take, checked before any query runs (a 400 names them)."""

from __future__ import annotations

from viewer.errors import BadRequest

MAX_PAGE = 1_000_000


def invalid(name: str, value: str, takes: str) -> BadRequest:
    """The 400 for parameter ``name``: what was given and what it takes."""
    shown = value if len(value) <= 80 else value[:77] + "..."
    return BadRequest(f"{name}={shown!r} is not valid: {name} takes {takes}")


def page_number(raw: str | None) -> int:
    """A 1-based page number (absent: 1)."""
    if raw is None or raw == "":
        return 1
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE:
        raise invalid("page", raw, f"a whole number from 1 to {MAX_PAGE}")
    return int(raw)
