"""The one agent filter: which rows a glob on ``agent_name`` keeps.

Used by the `transitions` step (``credit.agent_pattern``) and the trainer's reader (``agent``), so
a pattern means the same in both. The glob is ``fnmatch``'s, case-sensitive, on the whole name; an
unnamed agent is the empty name. It is matched against the distinct names in Python rather than
translated to a regex: ``fnmatch.translate`` is unanchored at the start for a search and spells
several ``*`` with atomic groups that Polars' and Arrow's regex engines refuse.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc


def keeps_every_agent(pattern: str | None) -> bool:
    """No pattern, ``""`` and ``"*"`` keep every row, unnamed agents included."""
    return pattern is None or pattern in ("", "*")


def matching_agents(pattern: str, names: Iterable[str | None]) -> set[str | None]:
    """The names among ``names`` that ``pattern`` keeps (``None``: an unnamed agent, matched as ``""``)."""
    return {n for n in set(names) if keeps_every_agent(pattern) or fnmatch.fnmatchcase(n or "", pattern)}


def agent_mask(pattern: str | None, agent_names: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A boolean mask (never null) over ``agent_names``: which rows the pattern keeps."""
    if keeps_every_agent(pattern):
        return pc.or_(pc.is_valid(agent_names), pc.is_null(agent_names))  # all true, of the right shape
    keep = matching_agents(pattern, pc.unique(agent_names).to_pylist())  # type: ignore[arg-type]
    named = pa.array(sorted(n for n in keep if n is not None), pa.string())
    mask = pc.fill_null(pc.is_in(agent_names, value_set=named), False)
    return pc.or_(mask, pc.is_null(agent_names)) if None in keep else mask
