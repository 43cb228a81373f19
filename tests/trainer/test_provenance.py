"""Rows sampled by an adapter the registry does not know are not trained on (trainer.provenance).

Real Delta tables and a real round (tiny model, local lake): the registry's hash is the one the round
that trained v0001 stored; the rows carry what a gateway would have recorded.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from schemas.lake import Lake
from schemas.tables import TRANSITIONS
from tests.trainer.helpers import transition, write_transitions
from trainer.config import TrainConfig
from trainer.data import read_transitions
from trainer.provenance import split_unverified
from trainer.registry import Registry
from trainer.round import count_pending, train_once

PROMPT, RESPONSE = [3, 4, 5, 6], [7, 8, 9]
KNOWN, OTHER = "a" * 64, "b" * 64


def test_a_hash_is_checked_against_its_versions_registered_hash() -> None:
    registered = {"v0001": KNOWN, "v0002": None}  # v0002: registered before hashes were recorded
    cases = [
        ("p@v0001", KNOWN, True),  # the registered files
        ("p@v0001", None, True),  # no hash recorded: proves nothing, kept as before
        ("p@v0001", OTHER, False),  # other files under v0001's name
        ("p@v0009", OTHER, False),  # no such version
        ("p@v0002", OTHER, True),  # nothing to check against
        ("agentlake-base", None, True),
    ]
    rows = pa.Table.from_pylist(
        [transition(i, PROMPT, RESPONSE, advantage=1.0, policy_version=pv, policy_sha256=sha)
         for i, (pv, sha, _) in enumerate(cases)],
        schema=TRANSITIONS,
    )  # fmt: skip
    kept, refused = split_unverified(rows, registered)
    assert kept["transition_id"].to_pylist() == [
        rows["transition_id"][i].as_py() for i, (_, _, ok) in enumerate(cases) if ok
    ]
    assert refused == {f"p@v0001#{'b' * 16}": 1, f"p@v0009#{'b' * 16}": 1}


def test_a_round_refuses_rows_of_unknown_adapters_and_counts_them(
    lake: Path, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = TrainConfig(
        base_model=str(tiny_model_dir),
        lake_root=str(lake),
        checkpoint_dir=str(tmp_path / "models"),
        lora_rank=4,
        batch_size=4,
        max_steps=1,
        min_new_transitions=1,
        progress=False,
        seed=0,
    )
    write_transitions(lake, [transition(i, PROMPT, RESPONSE, advantage=1.0) for i in range(2)])
    assert train_once(cfg=cfg).version == "v0001"
    registry = Registry(Lake(str(lake)))
    digest = registry.get("v0001")["manifest_sha256"]
    assert digest and len(digest) == 64

    def row(i: int, pv: str, sha: str | None) -> dict[str, object]:
        return transition(i, PROMPT, RESPONSE, advantage=1.0, policy_version=pv, policy_sha256=sha)

    write_transitions(
        lake,
        [
            row(2, "agentlake-policy@v0001", digest),  # the registered files: trained
            row(3, "agentlake-policy@v0001", digest),
            row(4, "agentlake-policy@v0001", None),  # a gateway that could not read the folder: trained
            row(5, "agentlake-policy@v0001", "0" * 64),  # other files under the name v0001: refused
            row(6, "agentlake-policy@v0001", "0" * 64),
            row(7, "agentlake-policy@v0042", digest),  # a version this registry never had: refused
        ],
    )
    with caplog.at_level(logging.WARNING, logger="trainer.round"):
        result = train_once(cfg=cfg)
    assert result.version == "v0002"
    assert result.metrics["n_examples"] == 3  # rows 2, 3, 4
    assert result.metrics["refused_unknown_adapter"] == 3
    recorded = json.loads(registry.get("v0002")["metrics"])
    assert recorded["refused_unknown_adapter"] == 3
    assert recorded["refused_adapters"] == {
        f"agentlake-policy@v0001#{'0' * 16}": 2,
        f"agentlake-policy@v0042#{digest[:16]}": 1,
    }
    assert any("refused 3 transitions" in r.getMessage() for r in caplog.records)
    # Refused rows are consumed, as stale ones are: the next round does not read them again.
    assert count_pending(cfg)[0] == 0
    first = json.loads(registry.get("v0001")["metrics"])
    assert first["refused_unknown_adapter"] == 0  # rows with no hash (the base model's) are never refused


def test_a_transitions_table_from_before_v4_reads_with_no_hashes(lake: Path) -> None:
    """Written without the column: every row reads with a null hash, so none is refused."""
    v3 = TRANSITIONS.remove(TRANSITIONS.get_field_index("policy_sha256"))
    rows = [transition(i, PROMPT, RESPONSE, advantage=1.0, policy_version="p@v0009") for i in range(2)]
    for r in rows:
        del r["policy_sha256"]
    write_deltalake(f"{lake}/transitions", pa.Table.from_pylist(rows, schema=v3), partition_by=["day"])
    data = read_transitions(Lake(str(lake)))
    assert data.rows["policy_sha256"].to_pylist() == [None, None]
    assert split_unverified(data.rows, {})[0].num_rows == 2  # v0009 is unknown, but no hash claims anything
