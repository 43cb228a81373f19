"""Settings load from defaults, agentlake.toml and the environment; mistakes are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.config import load_settings
from schemas.errors import ConfigError


def test_defaults(tmp_path: Path) -> None:
    s = load_settings(environ={})
    assert s.collector.http_port == 4318
    assert s.collector.grpc_port == 4317
    assert s.kafka.spans_topic == "agentlake.spans.v1"
    assert not s.kafka.external


def test_toml_then_env_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "agentlake.toml"
    cfg.write_text(
        '[collector]\nhttp_port = 5000\ngrpc_port = 5001\n[lake]\nroot = "s3://bucket/lake"\n'
        '[lake.storage_options]\nAWS_REGION = "eu-west-1"\n'
    )
    s = load_settings(cfg, environ={"AGENTLAKE_COLLECTOR__HTTP_PORT": "6000", "KAFKA_BOOTSTRAP_SERVERS": "k1:9092"})
    assert s.collector.http_port == 6000  # env wins
    assert s.collector.grpc_port == 5001  # file
    assert s.lake.root == "s3://bucket/lake"
    assert s.lake.storage_options == {"AWS_REGION": "eu-west-1"}
    assert s.kafka.external and s.kafka.bootstrap_servers == "k1:9092"


def test_env_json_values() -> None:
    s = load_settings(
        environ={
            "AGENTLAKE_GATEWAY__UPSTREAMS": '["http://a:1", "http://b:2"]',
            "AGENTLAKE_COLLECTOR__AUTH_TOKENS": '{"tok": "acme"}',
        }
    )
    assert s.gateway.upstreams == ["http://a:1", "http://b:2"]
    assert s.collector.auth_tokens == {"tok": "acme"}


def test_config_file_from_env(tmp_path: Path) -> None:
    cfg = tmp_path / "other.toml"
    cfg.write_text("[trainer]\nlora_rank = 8\n")
    assert load_settings(environ={"AGENTLAKE_CONFIG": str(cfg)}).trainer.lora_rank == 8


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("[collector]\nhttp_prot = 1\n", ["collector.http_prot", "unknown key"]),
        ("[colector]\nhttp_port = 1\n", ["colector", "unknown key"]),
        ("[collector]\nhttp_port = 70000\n", ["collector.http_port", "70000"]),
        ('[trainer]\nalgorithm = "dpo"\n', ["trainer.algorithm", "dpo"]),
        ("[credit]\ngamma = 1.5\n", ["credit.gamma"]),
        ("collector = 3\n", ["collector", "table"]),
        ("[collector\n", ["not valid TOML"]),
    ],
)
def test_bad_file_is_named(tmp_path: Path, text: str, needles: list[str]) -> None:
    cfg = tmp_path / "agentlake.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg, environ={})
    for needle in needles:
        assert needle in str(info.value)


@pytest.mark.parametrize(
    ("env", "needles"),
    [
        ({"AGENTLAKE_COLLECTOR__HTTP_PORT": "abc"}, ["collector.http_port", "$AGENTLAKE_COLLECTOR__HTTP_PORT"]),
        ({"AGENTLAKE_NOPE__X": "1"}, ["AGENTLAKE_NOPE__X", "unknown section"]),
        ({"AGENTLAKE_PORT": "1"}, ["AGENTLAKE_PORT", "AGENTLAKE_<SECTION>__<KEY>"]),
        ({"AGENTLAKE_KAFKA__PARTITIONS": "0"}, ["kafka.partitions"]),
    ],
)
def test_bad_env_is_named(env: dict[str, str], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(environ=env)
    for needle in needles:
        assert needle in str(info.value)


def test_missing_explicit_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", environ={})


def test_missing_reward_is_drop_or_a_finite_number() -> None:
    from schemas.config import CreditSettings

    assert CreditSettings(missing_reward=-1.0).missing_reward == -1.0
    for bad in ("nan", float("inf"), "skip"):
        with pytest.raises(ValueError):
            CreditSettings(missing_reward=bad)


def test_the_eval_gate_runs_on_a_canary_that_is_one_of_the_replicas() -> None:
    """The gate goes through the bus (serving.canary): eval tasks and replicas load together; the canary is the
    first replica unless named, and a named one must be a replica, refused when settings load."""
    both = load_settings(
        environ={}, overrides={"serving": {"replicas": ["a", "b"]}, "trainer": {"eval_tasks": "x.jsonl"}}
    )
    assert both.serving.canary_replica() == "a" and both.trainer.eval_tasks == Path("x.jsonl")
    named = load_settings(environ={}, overrides={"serving": {"replicas": ["a", "b"], "canary": "b"}})
    assert named.serving.canary_replica() == "b"
    assert load_settings(environ={}).serving.canary_replica() == ""  # no replicas: the gate scores on vllm.url
    with pytest.raises(ConfigError, match=r"serving.canary 'c' is not one of serving.replicas \['a', 'b'\]"):
        load_settings(environ={}, overrides={"serving": {"replicas": ["a", "b"], "canary": "c"}})
    with pytest.raises(ConfigError, match=r"serving.canary 'a' is not one of serving.replicas \[\]"):
        load_settings(environ={}, overrides={"serving": {"canary": "a"}})


def test_the_chat_template_and_the_tool_parser_are_checked_when_settings_load(tmp_path: Path) -> None:
    defaults = load_settings(environ={})
    assert defaults.model.chat_template is None and defaults.vllm.tool_call_parser is None  # the model's own
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    given = load_settings(
        environ={"AGENTLAKE_MODEL__CHAT_TEMPLATE": str(template), "AGENTLAKE_VLLM__TOOL_CALL_PARSER": ""}
    )
    assert given.model.chat_template == template and given.vllm.tool_call_parser == ""
    assert load_settings(environ={}, overrides={"model": {"chat_template": ""}}).model.chat_template is None
    with pytest.raises(ConfigError, match=r"model.chat_template[\s\S]*does not exist: give the path of a Jinja"):
        load_settings(environ={}, overrides={"model": {"chat_template": str(tmp_path / "nope.jinja")}})
    with pytest.raises(ConfigError, match="is a folder"):
        load_settings(environ={}, overrides={"model": {"chat_template": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"vllm.tool_call_parser[\s\S]*not a vLLM tool parser name"):
        load_settings(environ={}, overrides={"vllm": {"tool_call_parser": "--enable-auto-tool-choice"}})
