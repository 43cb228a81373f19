"""The one publisher every publish builds (``serving.publish.gated_publisher``): the eval gate and the restart
come from the settings unless the caller names its own, and a bad tasks file is refused before anything runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from schemas.config import Settings, load_settings
from serving.errors import PublishError
from serving.eval_gate import EvalTask
from serving.publish import gated_publisher
from tests.serving.helpers import FakeVllm


def _settings(tmp_path: Path, **sections: dict[str, Any]) -> Settings:
    base = {"state": {"dir": str(tmp_path / "state")}, "lake": {"root": str(tmp_path / "lake")}}
    return load_settings(environ={}, discover=False, overrides={**base, **sections})


def test_the_gate_and_the_restart_come_from_the_settings(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "2+2=", "answer": "4"}\n')
    ran = tmp_path / "restarted-on"
    command = [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])", str(ran), "{folder}"]
    settings = _settings(tmp_path, trainer={"eval_tasks": str(tasks)}, vllm={"restart_command": command})

    pub = gated_publisher(settings)
    assert list(pub.eval_tasks) == [EvalTask("2+2=", "4")]
    assert pub.restart is not None
    pub.restart("/models/v0007")
    assert ran.read_text() == "/models/v0007"


def test_the_callers_tasks_and_restart_win(tmp_path: Path) -> None:
    setting_tasks, option_tasks = tmp_path / "setting.jsonl", tmp_path / "option.jsonl"
    setting_tasks.write_text('{"prompt": "2+2=", "answer": "4"}\n')
    option_tasks.write_text('{"prompt": "3+3=", "answer": "6"}\n')
    settings = _settings(
        tmp_path, trainer={"eval_tasks": str(setting_tasks)}, vllm={"restart_command": ["false", "{folder}"]}
    )
    restarted: list[str] = []

    pub = gated_publisher(settings, restart=restarted.append, eval_tasks=option_tasks, vllm_url="http://vllm:9")
    assert list(pub.eval_tasks) == [EvalTask("3+3=", "6")]
    assert pub.vllm_url == "http://vllm:9"
    assert pub.restart is not None
    pub.restart("/models/v0007")
    assert restarted == ["/models/v0007"]


def test_nothing_configured_is_no_gate_and_no_restart(tmp_path: Path) -> None:
    pub = gated_publisher(_settings(tmp_path))
    assert (list(pub.eval_tasks), pub.restart) == ([], None)


def test_a_bad_tasks_file_or_restart_command_is_refused_before_anything_is_loaded(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="cannot be read"):
        gated_publisher(_settings(tmp_path), eval_tasks=tmp_path / "missing.jsonl")
    with pytest.raises(PublishError, match="never names"):
        gated_publisher(_settings(tmp_path, vllm={"restart_command": ["systemctl", "restart", "vllm"]}))


@pytest.mark.slow  # a Dagster run of the policy asset that trains a round (about 30 s on 2 cores)
def test_the_policy_asset_publishes_through_it(
    lake: Path, tiny_model_dir: Path, vllm: FakeVllm, tmp_path: Path
) -> None:
    """The asset's new version is loaded by the gated publisher; a broken gate setting stops it before vLLM."""
    from dagster import build_asset_context

    from pipelines.defs.assets.policy import policy
    from pipelines.defs.resources import KafkaResource, LakeResource, TrainerResource
    from tests.trainer.helpers import build_tokenizer, transition, write_transitions

    tok = build_tokenizer()
    prompt, answer = tok("what is two plus three")["input_ids"], tok("good yes")["input_ids"]

    def resource(**trainer: Any) -> TrainerResource:
        return TrainerResource(
            lake=LakeResource(root=str(lake)),
            kafka=KafkaResource(bootstrap_servers="127.0.0.1:1", spans_topic="s", rewards_topic="r"),
            trainer={"min_new_transitions": 1, "lora_rank": 4, **trainer},
            model={"base": str(tiny_model_dir)},
            vllm={"port": vllm.server_address[1]},
            state_dir=str(tmp_path / "state"),
        )

    write_transitions(lake, [transition(i, prompt, answer, advantage=1.0) for i in range(2)])
    # Each context closed here, not by the garbage collector (its teardown imports, which must not run mid-import).
    with build_asset_context() as context:
        meta = policy(context, trainer=resource()).metadata
    assert (meta["version"], meta["publish_status"]) == ("v0001", "published")
    assert [Path(p).name for p in vllm.loads()] == ["v0001"]

    write_transitions(lake, [transition(i, prompt, answer, advantage=1.0) for i in range(2, 4)])
    with build_asset_context() as context, pytest.raises(PublishError, match="missing.jsonl cannot be read"):
        policy(context, trainer=resource(eval_tasks=str(tmp_path / "missing.jsonl")))
    assert [Path(p).name for p in vllm.loads()] == ["v0001"]  # v0002 trained, refused before any load
