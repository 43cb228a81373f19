"""Lake-side reward functions (issue 13): a user's module named in settings, scored by the Dagster asset.

Spans are made with the real OTel SDK and committed to a real `spans` table as ingestion does; the
trajectories step runs as its asset does; `reward_functions` and `transitions` are materialized with
Dagster against the temporary lake, with the user's module imported from a file on ``sys.path``.
"""

from __future__ import annotations

import itertools
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from dagster import materialize

from agentlake import Trajectory, reward_fn
from pipelines.bronze.decoding import KafkaRecord, decode_reward_event, decode_spans
from pipelines.defs.assets import reward_functions, transitions
from pipelines.defs.resources import CreditResource, LakeResource, TokenizerResource
from pipelines.errors import RewardFunctionError
from pipelines.silver.identity import resolve_rollouts
from pipelines.silver.reward_functions import load, reward_id, score_trajectories, scored_rewards
from pipelines.silver.trajectories import assemble
from pipelines.silver.trajectories_step import update_trajectories
from schemas.lake import Lake
from schemas.tables import REWARDS
from tests.pipelines.otel import Call, Rollout, encode, make_spans
from tests.pipelines.test_identity import KAFKA, NOW

USER_MODULE = """
from agentlake import Trajectory, reward_fn


@reward_fn(name="exact_answer", version="{version}")
def exact_answer(t: Trajectory) -> float | None:
    if t.answer is None or not t.tool_results:
        return None
    return float(t.answer.strip() == "{expected}")


@reward_fn(name="calls", version="1")
def calls(t: Trajectory) -> float | None:
    # the trajectory's own spans come along: here, the tool span the agent recorded
    if not any(s["attributes"].get("tool.name") == "calc" for s in t.spans):
        return None
    return float(len(t.calls))
"""
_names = itertools.count()


@pytest.fixture
def user_modules(tmp_path: Path) -> Any:
    """Write a reward module (a fresh name each time, as a changed file would be reloaded) on sys.path."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    sys.path.insert(0, str(folder))
    written: list[str] = []

    def write(version: str = "1", expected: str = "42") -> str:
        name = f"my_rewards_{next(_names)}"
        (folder / f"{name}.py").write_text(textwrap.dedent(USER_MODULE.format(version=version, expected=expected)))
        written.append(name)
        return name

    yield write
    sys.path.remove(str(folder))
    for name in written:
        sys.modules.pop(name, None)


class Lakeside:
    """A lake fed with rollouts one delivery at a time, and the assets run over it."""

    def __init__(self, root: Path) -> None:
        self.lake = Lake(str(root))
        self.offset = 0

    def deliver(self, *answers: tuple[str, str, float]) -> None:
        """Rollouts (id, the model's answer, the agent's own primary reward), trajectories assembled."""
        recs = []
        for rid, answer, reward in answers:
            i = int(rid[1:])
            call = Call(
                prompt=[1, 2, i],
                response=[3, i],
                logprobs=[-0.5, -0.25],
                messages_in=[{"role": "user", "content": "6 x 7?"}, {"role": "tool", "content": "calc: 42"}],
                messages_out=[{"role": "assistant", "content": answer}],
            )
            r = Rollout(rid, task_id="mul", calls=[call], final_reward=reward, t0_ns=(1_750_000_000 + i) * 10**9)
            recs.append(KafkaRecord("s", 0, self.offset, None, encode(make_spans(r)), []))
            self.offset += 1
        self.lake.write("spans", decode_spans(recs)[0], txns={"kafka:s:0": recs[-1].offset})
        update_trajectories(self.lake, KAFKA, idle_timeout_s=1e9, now=NOW)

    def late_event(self, rollout_id: str, name: str, value: float) -> None:
        """A reward event for a rollout already assembled (Kafka topic "r"), trajectories re-assembled."""
        body = json.dumps({"rollout_id": rollout_id, "name": name, "value": value}).encode()
        row = decode_reward_event(KafkaRecord("r", 0, 0, None, body, [], timestamp_ms=1_750_000_100_000))
        self.lake.write("rewards", pa.Table.from_pylist([row], schema=REWARDS), txns={"kafka:r:0": 0})
        update_trajectories(self.lake, KAFKA, idle_timeout_s=1e9, now=NOW)

    def score(
        self, *modules: str, reward: str | None = None, backfill: bool = False, judge: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Materialize `reward_functions` (then `transitions`); the scoring asset's metadata.

        ``judge``: the `[judge]` settings the asset's credit resource carries (test_judge.py)."""
        credit = {"reward_modules": list(modules), "advantage": "none", **({"reward": reward} if reward else {})}
        resources = {
            "lake": LakeResource(root=self.lake.root),
            "credit": CreditResource(credit=credit, judge=judge or {}),
            "tokenizer": TokenizerResource(),
        }
        config = {"ops": {"reward_functions": {"config": {"backfill": backfill}}}}
        result = materialize([reward_functions], resources=resources, run_config=config)
        assert result.success
        meta = result.asset_materializations_for_node("reward_functions")[0].metadata
        assert materialize([transitions], resources=resources).success
        return {k: v.value for k, v in meta.items()}

    def table(self, name: str) -> pl.DataFrame:
        return pl.read_delta(self.lake.uri(name))

    def fn_rewards(self) -> pl.DataFrame:
        cols = ["reward_id", "source", "tenant", "rollout_id", "attempt_id", "name", "value", "event_time", "day"]
        rows = self.table("rewards").filter(pl.col("source").str.starts_with("fn:"))
        return rows.select(cols).sort("reward_id")


def by_rollout(df: pl.DataFrame, column: str) -> dict[str, Any]:
    return dict(df.select("rollout_id", column).iter_rows())


def test_scores_land_in_rewards_and_the_chosen_one_drives_final_reward_and_transitions(
    tmp_path: Path, user_modules: Any
) -> None:
    side = Lakeside(tmp_path / "lake")
    # the agent's own (primary) reward says the opposite of the exact answer
    side.deliver(("r0", "42", 0.0), ("r1", "41", 1.0))
    module = user_modules()
    meta = side.score(module, reward="exact_answer")
    assert meta["scored"] == 4 and meta["rollouts_updated"] == 2

    fn = side.fn_rewards()
    assert sorted(fn["source"].unique().to_list()) == ["fn:calls@1", "fn:exact_answer@1"]
    exact = fn.filter(pl.col("name") == "exact_answer")
    assert by_rollout(exact, "value") == {"r0": 1.0, "r1": 0.0}
    assert by_rollout(fn.filter(pl.col("name") == "calls"), "value") == {"r0": 1.0, "r1": 1.0}
    assert exact.filter(pl.col("rollout_id") == "r0")["reward_id"][0] == reward_id(
        "default", "r0", exact["attempt_id"][0], "fn:exact_answer@1"
    )

    traj = side.table("trajectories")
    assert by_rollout(traj, "final_reward") == {"r0": 1.0, "r1": 0.0}
    entries = traj.filter(pl.col("rollout_id") == "r0")["rewards"][0].to_list()
    assert {(e["name"], e["source"]) for e in entries} == {
        ("primary", "span"),
        ("exact_answer", "fn:exact_answer@1"),
        ("calls", "fn:calls@1"),
    }
    # the transitions step rebuilt the groups from the re-scored trajectories
    assert by_rollout(side.table("transitions"), "reward") == {"r0": 1.0, "r1": 0.0}


def test_without_a_choice_the_primary_reward_still_drives_credit(tmp_path: Path, user_modules: Any) -> None:
    side = Lakeside(tmp_path / "lake")
    side.deliver(("r0", "42", 0.0), ("r1", "41", 1.0))
    side.score(user_modules())
    assert side.fn_rewards().height == 4
    assert by_rollout(side.table("trajectories"), "final_reward") == {"r0": 0.0, "r1": 1.0}
    assert by_rollout(side.table("transitions"), "reward") == {"r0": 0.0, "r1": 1.0}


def test_reruns_score_only_what_they_must(tmp_path: Path, user_modules: Any) -> None:
    side = Lakeside(tmp_path / "lake")
    side.deliver(("r0", "42", 0.0), ("r1", "41", 1.0))
    v1 = user_modules(version="1", expected="42")
    side.score(v1, reward="exact_answer")
    versions = {t: side.lake.version(t) for t in ("rewards", "trajectories")}

    # unchanged functions, nothing new: nothing is scored, nothing written
    assert side.score(v1, reward="exact_answer")["scored"] == 0
    assert {t: side.lake.version(t) for t in versions} == versions

    # a new trajectory: only it is scored, by each function
    side.deliver(("r2", "42", 0.0))
    assert side.score(v1, reward="exact_answer")["scored"] == 2
    assert side.fn_rewards().height == 6

    # a new version of one function: it scores every trajectory again, the other scores none
    v2 = user_modules(version="2", expected="41")
    meta = side.score(v2, reward="exact_answer")
    assert meta["scored"] == 3
    fn = side.fn_rewards()
    assert fn.height == 9  # the rows of version 1 stay, as history
    assert by_rollout(fn.filter(pl.col("source") == "fn:exact_answer@2"), "value") == {"r0": 0.0, "r1": 1.0, "r2": 0.0}
    traj = side.table("trajectories")
    assert by_rollout(traj, "final_reward") == {"r0": 0.0, "r1": 1.0, "r2": 0.0}
    sources = {e["source"] for entries in traj["rewards"].to_list() for e in entries}
    assert sources == {"span", "fn:exact_answer@2", "fn:calls@1"}  # version 1 no longer attached
    assert by_rollout(side.table("transitions"), "reward") == {"r0": 0.0, "r1": 1.0, "r2": 0.0}


def test_a_backfill_gives_the_rows_of_the_incremental_path(tmp_path: Path, user_modules: Any) -> None:
    module = user_modules()
    incremental = Lakeside(tmp_path / "a")
    incremental.deliver(("r0", "42", 0.0))
    incremental.score(module, reward="exact_answer")
    incremental.deliver(("r1", "41", 1.0), ("r2", "42", 1.0))
    incremental.score(module, reward="exact_answer")

    at_once = Lakeside(tmp_path / "b")
    at_once.deliver(("r0", "42", 0.0))
    at_once.deliver(("r1", "41", 1.0), ("r2", "42", 1.0))
    meta = at_once.score(module, reward="exact_answer", backfill=True)
    assert meta["scored"] == 6
    assert at_once.fn_rewards().equals(incremental.fn_rewards())
    # and in chunks of one rollout (one commit each, the watermarks with the last)
    chunked = Lakeside(tmp_path / "c")
    chunked.deliver(("r0", "42", 0.0), ("r1", "41", 1.0), ("r2", "42", 1.0))
    res = score_trajectories(chunked.lake, load([module]), chosen="exact_answer", chunk_rollouts=1)
    assert res.rollouts_updated == 3 and chunked.fn_rewards().equals(incremental.fn_rewards())
    assert by_rollout(chunked.table("trajectories"), "final_reward") == {"r0": 1.0, "r1": 0.0, "r2": 1.0}
    assert score_trajectories(chunked.lake, load([module]), chosen="exact_answer").scored == {}

    # a backfill of what is already scored finds every row as it is: nothing to write
    rewards_version = incremental.lake.version("rewards")
    meta = incremental.score(module, reward="exact_answer", backfill=True)
    assert meta["scored"] == 6 and meta["rewards_written"] == 0 and meta["rollouts_updated"] == 0
    assert incremental.lake.version("rewards") == rewards_version
    assert by_rollout(incremental.table("transitions"), "reward") == {"r0": 1.0, "r1": 0.0, "r2": 1.0}


def test_a_module_that_cannot_be_imported_is_named(user_modules: Any) -> None:
    with pytest.raises(RewardFunctionError, match="no_such_rewards_module"):
        load(["no_such_rewards_module"])
    assert [f.name for f in load([user_modules()])] == ["calls", "exact_answer"]


def test_a_rollout_assembled_again_is_scored_again(tmp_path: Path, user_modules: Any) -> None:
    side = Lakeside(tmp_path / "lake")
    side.deliver(("r0", "42", 0.0), ("r1", "41", 1.0))
    module = user_modules()
    side.score(module, reward="exact_answer")
    side.late_event("r0", "late", 0.5)  # the trajectories step rebuilds r0 from spans and events
    assert side.score(module, reward="exact_answer")["scored"] == 2  # r0, by each function
    traj = side.table("trajectories")
    assert by_rollout(traj, "final_reward") == {"r0": 1.0, "r1": 0.0}
    entries = traj.filter(pl.col("rollout_id") == "r0")["rewards"][0].to_list()
    assert sorted(e["name"] for e in entries) == ["calls", "exact_answer", "late", "primary"]
    assert side.fn_rewards().height == 4
    assert by_rollout(side.table("transitions"), "reward") == {"r0": 1.0, "r1": 0.0}


def test_a_backfill_removes_a_score_the_function_no_longer_gives(tmp_path: Path, user_modules: Any) -> None:
    side = Lakeside(tmp_path / "lake")
    side.deliver(("r0", "42", 0.0), ("r1", "41", 1.0))
    edited = user_modules()
    side.score(edited, reward="exact_answer")
    # the same name and version, edited in place to answer None for r1 (no bump: only a backfill sees it)
    path = Path(sys.modules[edited].__file__ or "")
    path.write_text(path.read_text().replace("if t.answer is None", "if t.rollout_id == 'r1' or t.answer is None"))
    sys.modules.pop(edited)
    assert side.score(edited, reward="exact_answer")["scored"] == 0
    meta = side.score(edited, reward="exact_answer", backfill=True)
    assert meta["rewards_removed"] == 1 and meta["rollouts_updated"] == 1
    exact = side.fn_rewards().filter(pl.col("name") == "exact_answer")
    assert exact["rollout_id"].to_list() == ["r0"]
    traj = side.table("trajectories")
    # r1 has no exact_answer now: its final reward falls back to the primary one
    assert by_rollout(traj, "final_reward") == {"r0": 1.0, "r1": 1.0}
    assert by_rollout(side.table("transitions"), "reward") == {"r0": 1.0, "r1": 1.0}


def test_choosing_another_reward_recomputes_every_final_reward(tmp_path: Path, user_modules: Any) -> None:
    side = Lakeside(tmp_path / "lake")
    side.deliver(("r0", "42", 0.0), ("r1", "41", 1.0))
    module = user_modules()
    side.score(module)
    assert by_rollout(side.table("trajectories"), "final_reward") == {"r0": 0.0, "r1": 1.0}
    meta = side.score(module, reward="exact_answer")
    assert meta["rollouts_updated"] == 2 and meta["rewards_written"] == 0
    assert by_rollout(side.table("trajectories"), "final_reward") == {"r0": 1.0, "r1": 0.0}
    assert by_rollout(side.table("transitions"), "reward") == {"r0": 1.0, "r1": 0.0}


def test_a_score_that_is_not_a_number_is_refused_with_its_function_and_rollout(tmp_path: Path) -> None:
    side = Lakeside(tmp_path / "lake")
    side.deliver(("r0", "42", 0.0))

    @reward_fn(name="judge", version="1")
    def judge(t: Trajectory) -> float | None:
        return "yes"  # type: ignore[return-value]

    with pytest.raises(RewardFunctionError, match=r"judge@1 returned 'yes' for rollout 'r0'"):
        scored_rewards(side.table("trajectories"), [judge])
    with pytest.raises(Exception, match="letters, digits"):
        reward_fn(name="exact answer")


def test_assemble_takes_the_chosen_reward_as_final() -> None:
    call = Call(prompt=[1], response=[2], logprobs=[-0.5], reward_after=0.25)
    spans = make_spans(Rollout("r0", calls=[call], final_reward=1.0))
    rows = pl.from_arrow(decode_spans([KafkaRecord("s", 0, 0, None, encode(spans), [])])[0])
    assert isinstance(rows, pl.DataFrame)
    rows = resolve_rollouts(rows)
    body = json.dumps({"rollout_id": "r0", "name": "judge", "value": 0.5}).encode()
    event = decode_reward_event(KafkaRecord("r", 0, 0, None, body, [], timestamp_ms=1_750_000_100_000))
    events = pl.from_arrow(pa.Table.from_pylist([event], schema=REWARDS))
    assert isinstance(events, pl.DataFrame)

    def final(reward_name: str | None) -> float:
        table = assemble(rows, events, now=NOW, idle_timeout_s=1e9, reward_name=reward_name)
        return table.column("final_reward")[0].as_py()

    assert final(None) == 1.0  # the last primary
    assert final("judge") == 0.5
    assert final("no_such_reward") == 1.0  # absent: the primary one
