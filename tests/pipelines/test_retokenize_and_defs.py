"""Calls without token ids are retokenized with the policy's chat template; the code location loads."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pytest

from pipelines.bronze.decoding import KafkaRecord, SpanBatch
from pipelines.gold.retokenize import Retokenizer
from pipelines.gold.transitions import build
from pipelines.silver.trajectories import assemble
from schemas.config import CreditSettings
from tests.pipelines.otel import Call, Rollout, encode, make_spans

WORDS = ["<unk>", "<eos>", "<system>", "<user>", "<assistant>", "what", "is", "2+2", "4", "calc", "hi", "x"]
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny word-level tokenizer with a chat template, saved as a Hugging Face folder."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.chat_template = TEMPLATE
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    return path


def traj_of(r: Rollout) -> pl.DataFrame:
    batch = SpanBatch()
    batch.add(KafkaRecord("t", 0, 0, None, encode(make_spans(r)), []))
    assert not batch.quarantine
    frame = pl.from_arrow(batch.to_table())
    assert isinstance(frame, pl.DataFrame)
    out = pl.from_arrow(assemble(frame, now=dt.datetime.now(dt.UTC), idle_timeout_s=60))
    assert isinstance(out, pl.DataFrame)
    return out


def test_messages_only_calls_are_retokenized_and_flagged(tokenizer_dir: Path) -> None:
    call = Call(
        messages_in=[{"role": "user", "content": "what is 2+2"}],
        messages_out=[{"role": "assistant", "content": "4"}],
        policy_version=None,
    )
    exact = Call(prompt=[3, 5], response=[8])
    traj = traj_of(Rollout("m1", calls=[call, exact], final_reward=1.0))
    assert traj["n_llm_calls"].to_list() == [2]
    retok = Retokenizer(str(tokenizer_dir))
    out = build(traj, CreditSettings(advantage="none"), now=dt.datetime.now(dt.UTC), retokenizer=retok)
    got = pl.from_arrow(out.table).sort("step")
    ids = {w: i for i, w in enumerate(WORDS)}
    assert got["token_source"].to_list() == ["retokenized", "exact"]
    assert got["prompt_ids"][0].to_list() == [ids[w] for w in ["<user>", "what", "is", "2+2", "<eos>", "<assistant>"]]
    assert got["response_ids"][0].to_list() == [ids["4"], ids["<eos>"]]
    assert got["response_logprobs"][0] is None
    assert got["loss_mask"][0].to_list() == [1, 1]

    # without a tokenizer the call is dropped and counted, never silently lost
    out = build(traj, CreditSettings(advantage="none"), now=dt.datetime.now(dt.UTC), retokenizer=None)
    assert out.table.num_rows == 1 and out.dropped == {"no_tokens_no_tokenizer": 1}


def test_model_chat_template_replaces_the_folders_own(tokenizer_dir: Path, tmp_path: Path) -> None:
    """model.chat_template reaches the retokenizer (the policy's, and the Dagster resource's) as it reaches vLLM."""
    from pipelines.defs.resources import TokenizerResource
    from pipelines.gold.retokenize import policy_retokenizer
    from schemas.config import load_settings

    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }} <eos> {% endfor %}")
    msgs = '[{"role": "user", "content": "what is 2+2"}]'
    ids = {w: i for i, w in enumerate(WORDS)}
    assert Retokenizer(str(tokenizer_dir)).encode(msgs, '[{"role": "assistant", "content": "4"}]') == (
        [ids[w] for w in ["<user>", "what", "is", "2+2", "<eos>", "<assistant>"]],
        [ids["4"], ids["<eos>"]],
    )
    settings = load_settings(
        environ={}, overrides={"model": {"base": str(tokenizer_dir), "chat_template": str(template)}}
    )
    loaded = policy_retokenizer(settings)()
    assert loaded is not None and loaded.tokenizer.chat_template == template.read_text()
    resource = TokenizerResource(path=str(tokenizer_dir), chat_template=str(template)).retokenizer()
    assert resource is not None and resource.encode(msgs, '[{"role": "assistant", "content": "4"}]') == (
        [ids[w] for w in ["what", "is", "2+2", "<eos>"]],
        [ids["4"], ids["<eos>"]],
    )


def test_merge_agent_filter_and_drop_counts() -> None:
    calls = [
        Call(prompt=[1, 2], response=[3], logprobs=[-0.5], agent="solver"),
        Call(prompt=[1, 2, 3, 9], response=[4, 5], logprobs=[-0.1, -0.2], agent="solver"),
        Call(prompt=[7], response=[8], agent="solver"),  # does not continue: a mismatch
        Call(prompt=[1], response=[2], agent="critic"),
    ]
    traj = traj_of(Rollout("m2", calls=calls, final_reward=1.0))
    credit = CreditSettings(merge_calls=True, agent_pattern="solv*", advantage="none")
    out = build(traj, credit, now=dt.datetime.now(dt.UTC))
    got = pl.from_arrow(out.table).sort("step")
    assert got["merged_calls"].to_list() == [2, 1]
    assert got["response_ids"][0].to_list() == [3, 9, 4, 5]
    assert got["loss_mask"][0].to_list() == [1, 0, 1, 1]
    assert got["response_logprobs"][0].to_list() == pytest.approx([-0.5, 0.0, -0.1, -0.2])
    assert out.merge_mismatches == 1 and out.dropped == {"agent_filtered": 1}
    long = build(traj, CreditSettings(max_tokens=2, advantage="none"), now=dt.datetime.now(dt.UTC))
    assert long.dropped["too_long"] == 2
    unrewarded = build(traj_of(Rollout("m3", calls=calls[:1])), CreditSettings(), now=dt.datetime.now(dt.UTC))
    assert unrewarded.dropped == {"no_reward_waiting": 1}


def test_definitions_load() -> None:
    from dagster import AssetKey

    import pipelines

    defs = pipelines.defs
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == {"spans", "rewards", "trajectories", "transitions", "reward_functions", "policy"}
    assert {defs.resolve_job_def(n).name for n in ("ingest", "lake", "train", "maintenance_job")}
    assert defs.get_sensor_def("kafka_sensor") and defs.get_schedule_def("maintenance_job_schedule")
    assert defs.get_sensor_def("enough_transitions_sensor") and defs.get_schedule_def("train_on_schedule")
    assert graph.get(AssetKey("policy")).parent_keys == {AssetKey("transitions")}
