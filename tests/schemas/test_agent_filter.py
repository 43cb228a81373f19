"""The one agent filter (`schemas.agent_filter`): the glob means what ``fnmatch.fnmatchcase`` says,
for the transitions step and the trainer alike."""

from __future__ import annotations

import fnmatch

import polars as pl
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from schemas.agent_filter import agent_mask, keeps_every_agent

NAMES = st.one_of(st.none(), st.text(alphabet="abp*?[]x-", max_size=6))
PATTERNS = st.text(alphabet="abpx*?", min_size=1, max_size=6)


@given(pattern=PATTERNS, names=st.lists(NAMES, max_size=20))
def test_the_mask_is_fnmatchcase_on_every_row(pattern: str, names: list[str | None]) -> None:
    mask = agent_mask(pattern, pa.array(names, pa.string())).to_pylist()
    want = [keeps_every_agent(pattern) or fnmatch.fnmatchcase(n or "", pattern) for n in names]
    assert mask == want


def test_the_glob_matches_whole_names_and_several_stars() -> None:
    names = pa.array(["planner", "myplanner", "planner-2", None, "a1b2c"], pa.string())
    # before: the transitions step searched fnmatch's regex unanchored ("myplanner" matched "planner*"),
    # and a pattern with several stars was an atomic group Polars' regex engine refused
    assert agent_mask("planner*", names).to_pylist() == [True, False, True, False, False]
    assert agent_mask("a*b*c", names).to_pylist() == [False, False, False, False, True]
    assert agent_mask("*", names).to_pylist() == [True] * 5  # unnamed agents too
    assert agent_mask(None, names).to_pylist() == [True] * 5
    # the trainer's reader and the transitions step use the same mask
    assert pl.Series(agent_mask("plan*", pl.Series(names.to_pylist()).to_arrow())).to_list() == [
        True,
        False,
        True,
        False,
        False,
    ]
