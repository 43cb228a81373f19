"""Policy lines (issue 13): one LoRA per listed agent, its own versions, trained on its own rows only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.dataset as pds
import pytest

from schemas.config import Settings, load_settings
from schemas.errors import ConfigError
from schemas.lake import Lake
from serving.publish import Publisher
from tests.serving.helpers import FakeVllm
from tests.trainer.helpers import build_tokenizer, transition, write_transitions
from trainer.config import TrainConfig
from trainer.errors import TrainerError
from trainer.lines import count_pending_lines, max_loras_warning, policy_lines, served_names, train_lines
from trainer.registry import Registry
from trainer.round import train_once

TRAIN = dict(max_steps=1, lora_rank=4, batch_size=8, progress=False)


@pytest.fixture(scope="module")
def tokens() -> dict[str, list[int]]:
    tok = build_tokenizer()
    return {w: tok(w)["input_ids"] for w in ("what is two plus three", "good yes", "bad")}


def _rows(tokens: dict[str, list[int]], ids: range, agent: str) -> list[dict[str, Any]]:
    prompt = tokens["what is two plus three"]
    return [
        transition(i, prompt, tokens["good yes"] if i % 2 else tokens["bad"], advantage=1.0, agent=agent, group=agent)
        for i in ids
    ]


def _settings(lake: Path, model: Path, agents: list[str]) -> Settings:
    return load_settings(
        environ={},
        overrides={
            "lake": {"root": str(lake)},
            "model": {"base": str(model)},
            "trainer": {"agents": agents, "min_new_transitions": 2},
        },
    )


def _trained_agents(lake: Path, version: str) -> set[str]:
    """The agents of the transitions ``version`` trained on, through training_lineage."""
    table = Lake(str(lake)).table("training_lineage")
    assert table is not None
    ids = table.to_pyarrow_dataset().to_table(filter=pds.field("model_version") == version)["transition_id"]
    rows = pds.dataset(f"{lake}/transitions", format="parquet", partitioning="hive").to_table()
    by_id = dict(zip(rows["transition_id"].to_pylist(), rows["agent_name"].to_pylist(), strict=True))
    return {by_id[i] for i in ids.to_pylist()}


@pytest.mark.slow  # a training round per agent: ~6 s
def test_each_listed_agent_gets_a_line_trained_on_its_own_rows_and_one_line_moves_alone(
    lake: Path, tiny_model_dir: Path, tokens: dict[str, list[int]], vllm: FakeVllm
) -> None:
    settings = _settings(lake, tiny_model_dir, ["planner", "solver"])
    write_transitions(lake, _rows(tokens, range(0, 4), "planner") + _rows(tokens, range(100, 104), "solver"))
    write_transitions(lake, _rows(tokens, range(200, 204), "critic"))  # no line of its own: nobody takes it

    assert count_pending_lines(settings, **TRAIN)[0] == 4
    first = train_lines(settings, **TRAIN)
    assert [(r.agent, r.version, r.n_transitions) for r in first] == [("planner", "v0001", 4), ("solver", "v0002", 4)]
    registry = Registry(Lake(str(lake)))
    rows = {r["version"]: r for r in registry.rows()}
    assert {v: (r["agent"], r["served_name"], r["parent_version"]) for v, r in rows.items()} == {
        "v0001": ("planner", "agentlake-policy-planner", None),
        "v0002": ("solver", "agentlake-policy-solver", None),
    }
    assert _trained_agents(lake, "v0001") == {"planner"}
    assert _trained_agents(lake, "v0002") == {"solver"}

    # Publishing loads each line's adapter under its own name; the single policy's line stays empty.
    pub = Publisher(registry=registry, vllm_url=vllm.url, served_name="agentlake-policy")
    for r in first:
        assert r.version is not None
        pub.publish(r.version)
    loaded = [(b["lora_name"], Path(b["lora_path"]).name) for p, b in vllm.requests if p == "/v1/load_lora_adapter"]
    assert loaded == [("agentlake-policy-planner", "v0001"), ("agentlake-policy-solver", "v0002")]
    assert registry.serving(agent="planner")["version"] == "v0001"  # type: ignore[index]
    assert registry.serving(agent="solver")["version"] == "v0002"  # type: ignore[index]
    assert registry.serving() is None

    # New rows for the planner only: its line moves on from its own published version, the solver's stays.
    write_transitions(lake, _rows(tokens, range(4, 8), "planner"))
    assert count_pending_lines(settings, **TRAIN)[0] == 4
    second = train_lines(settings, **TRAIN)
    assert [(r.agent, r.version, r.parent_version) for r in second] == [
        ("planner", "v0003", "v0001"),
        ("solver", None, None),
    ]
    assert "no new transitions" in second[1].reason
    assert _trained_agents(lake, "v0003") == {"planner"}
    pub.publish("v0003")
    assert registry.serving(agent="planner")["version"] == "v0003"  # type: ignore[index]
    solver = registry.serving(agent="solver")
    assert solver is not None and solver["version"] == "v0002" and solver["publish_status"] == "published"
    assert [b["lora_name"] for p, b in vllm.requests if p == "/v1/load_lora_adapter"][-1] == "agentlake-policy-planner"

    # Rolling the planner back stays within its line: the solver is still served its own version.
    back = pub.rollback(agent="planner")
    assert (back.version, back.previous) == ("v0001", "v0003")
    assert registry.serving(agent="solver")["version"] == "v0002"  # type: ignore[index]
    assert (vllm.requests[-1][1]["lora_name"], Path(vllm.requests[-1][1]["lora_path"]).name) == (
        "agentlake-policy-planner",
        "v0001",
    )


def test_without_agents_one_round_trains_the_single_policy_on_every_agent(
    lake: Path, tiny_model_dir: Path, tokens: dict[str, list[int]]
) -> None:
    settings = _settings(lake, tiny_model_dir, [])
    assert policy_lines(settings) == [None]
    assert served_names(settings) == {None: "agentlake-policy"}
    write_transitions(lake, _rows(tokens, range(0, 3), "planner") + _rows(tokens, range(100, 103), "solver"))
    [result] = train_lines(settings, **TRAIN)
    assert (result.agent, result.version, result.n_transitions) == (None, "v0001", 6)
    row = Registry(Lake(str(lake))).get("v0001")
    assert (row["agent"], row["served_name"]) == (None, "agentlake-policy")
    assert _trained_agents(lake, "v0001") == {"planner", "solver"}


def test_a_line_refuses_another_agents_filter_and_full_weights(lake: Path, tiny_model_dir: Path) -> None:
    cfg = TrainConfig(lake_root=str(lake), base_model=str(tiny_model_dir), agent="solver")
    with pytest.raises(TrainerError, match="planner"):
        train_once(cfg=cfg, line="planner")
    with pytest.raises(TrainerError, match="LoRA"):
        train_once(cfg=cfg.replace(agent=None, finetune="full"), line="planner")


def test_agent_names_must_make_served_names(lake: Path, tiny_model_dir: Path) -> None:
    for bad in (["plan*"], ["a b"], ["-x"], ["planner", "planner"]):
        with pytest.raises(ConfigError, match="agents"):
            _settings(lake, tiny_model_dir, bad)
    settings = _settings(lake, tiny_model_dir, ["planner", "solver.v2"])
    assert served_names(settings) == {
        "planner": "agentlake-policy-planner",
        "solver.v2": "agentlake-policy-solver.v2",
    }


def test_vllm_must_hold_every_lines_adapter(lake: Path, tiny_model_dir: Path) -> None:
    from agentlake.stack.vllm import vllm_argv

    settings = _settings(lake, tiny_model_dir, ["planner", "solver"])
    # the stack starts vLLM with room for two lines and the single policy
    argv = vllm_argv(settings, tiny_model_dir, port=1, gpu=False)
    assert argv[argv.index("--max-loras") + 1] == "3" and max_loras_warning(settings) is None
    settings.vllm.extra_args = ["--max-loras=2"]  # the operator's own value is kept, and flagged when too small
    assert "--max-loras" not in vllm_argv(settings, tiny_model_dir, port=1, gpu=False)
    warning = max_loras_warning(settings)
    assert warning is not None and '"--max-loras", "3"' in warning
    settings.vllm.extra_args = ["--max-loras", "3"]
    assert max_loras_warning(settings) is None
    single = _settings(lake, tiny_model_dir, [])
    assert max_loras_warning(single) is None and "--max-loras" not in vllm_argv(
        single, tiny_model_dir, port=1, gpu=False
    )


def test_the_policy_asset_trains_every_line_and_says_which(
    lake: Path, tiny_model_dir: Path, tokens: dict[str, list[int]]
) -> None:
    from dagster import build_asset_context

    from pipelines.defs.assets.policy import policy
    from pipelines.defs.resources import KafkaResource, LakeResource, TrainerResource

    write_transitions(lake, _rows(tokens, range(0, 3), "planner") + _rows(tokens, range(100, 101), "solver"))
    resource = TrainerResource(
        lake=LakeResource(root=str(lake)),
        kafka=KafkaResource(bootstrap_servers="127.0.0.1:1", spans_topic="s", rewards_topic="r"),
        trainer={"agents": ["planner", "solver"], "min_new_transitions": 2, "lora_rank": 4},
        model={"base": str(tiny_model_dir)},
        publish=False,
    )
    meta = policy(build_asset_context(), trainer=resource).metadata
    assert meta["trained"] is True
    assert (meta["planner/version"], meta["planner/n_transitions"]) == ("v0001", 3)
    assert (meta["solver/trained"], meta["solver/n_transitions"]) == (False, 1)  # 1 < min_new_transitions
    assert Registry(Lake(str(lake))).get("v0001")["agent"] == "planner"


def test_every_line_starts_with_its_own_published_identity_adapter(
    lake: Path, tiny_model_dir: Path, vllm: FakeVllm
) -> None:
    from serving.initial import ensure_initial_policies

    settings = load_settings(
        environ={},
        overrides={
            "lake": {"root": str(lake)},
            "model": {"base": str(tiny_model_dir)},
            "trainer": {"agents": ["planner", "solver"], "lora_rank": 4},
            "kafka": {"bootstrap_servers": ""},
        },
    )
    first = ensure_initial_policies(settings, vllm_url=vllm.url)
    assert first == {None: "v0001", "planner": "v0002", "solver": "v0003"}
    loads = [(b["lora_name"], Path(b["lora_path"]).name) for p, b in vllm.requests if p == "/v1/load_lora_adapter"]
    assert loads == [
        ("agentlake-policy", "v0001"),
        ("agentlake-policy-planner", "v0002"),
        ("agentlake-policy-solver", "v0003"),
    ]
    registry = Registry(Lake(str(lake)))
    assert [(r["agent"], r["served_name"]) for r in registry.rows()] == [
        (None, "agentlake-policy"),
        ("planner", "agentlake-policy-planner"),
        ("solver", "agentlake-policy-solver"),
    ]
    # vLLM restarted: the same versions are loaded again under their names, no new ones made.
    assert ensure_initial_policies(settings, vllm_url=vllm.url) == first
    assert len(registry.rows()) == 3
    assert [b["lora_name"] for p, b in vllm.requests if p == "/v1/load_lora_adapter"][3:] == [n for n, _ in loads]
