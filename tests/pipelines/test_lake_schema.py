"""A table written under an older schema version takes writes of the current one."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pyarrow as pa
from deltalake import write_deltalake

from schemas.lake import Lake
from schemas.tables import TRANSITIONS


def test_a_transitions_table_from_before_the_baseline_column_gains_it(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    v1 = TRANSITIONS.remove(TRANSITIONS.get_field_index("baseline"))
    write_deltalake(lake.uri("transitions"), v1.empty_table(), partition_by=["day"])
    row = dict.fromkeys(TRANSITIONS.names)
    row |= {
        "transition_id": "r/a/0",
        "rollout_id": "r",
        "tenant": "t",
        "group_id": "g",
        "step": 0,
        "prompt_ids": [1],
        "response_ids": [2],
        "loss_mask": [1],
        "reward": 1.0,
        "return": 1.0,
        "advantage": 0.5,
        "baseline": 0.5,
        "token_source": "exact",
        "credit_mode": "identical",
        "advantage_mode": "grpo",
        "merged_calls": 1,
        "day": dt.date(2030, 1, 1),
        "created_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
    }
    data = pa.Table.from_pylist([row], schema=TRANSITIONS)
    lake.write("transitions", data, mode="overwrite", predicate="group_id = 'g'")
    assert pl.read_delta(lake.uri("transitions"))["baseline"].to_list() == [0.5]
