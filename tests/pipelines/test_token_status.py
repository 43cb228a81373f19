"""token_status per transition, the mismatch filter, and why calls did not merge, on the shipped tokenizer.

A verifier is what renders the served model's prompt: here the same tokenizer with the same template (as a
vLLM serving the policy's folder renders it), or with another template (a server started with another
``--chat-template``); the HTTP endpoint itself is exercised against real vLLM in tests/stack.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipelines.gold.retokenize import Retokenizer
from pipelines.gold.token_check import TokenizeEndpoint
from pipelines.gold.transitions import build
from schemas.config import CreditSettings
from tests.pipelines.otel import Call, Rollout
from tests.pipelines.test_retokenize_and_defs import traj_of

NOW = dt.datetime.now(dt.UTC)
# ChatML that strips reasoning (<think>...</think>) from every assistant turn but the last, as Qwen3's does
STRIPPING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}{{ (m['content'] or '').split('</think>')[-1] }}"
    "{% else %}{{ m['content'] or '' }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
KEEPING = STRIPPING.replace("{{ (m['content'] or '').split('</think>')[-1] }}", "{{ m['content'] or '' }}")


def _retok(smollm2_dir: Path, tmp_path: Path, template: str | None = None) -> Retokenizer:
    if template is None:
        return Retokenizer(str(smollm2_dir))
    path = tmp_path / f"t{abs(hash(template))}.jinja"
    path.write_text(template)
    return Retokenizer(str(smollm2_dir), str(path))


def _call(inp: list[dict[str, Any]], out: list[dict[str, Any]]) -> Call:
    return Call(messages_in=inp, messages_out=out, policy_version=None)


def _statuses(out: Any) -> list[str]:  # noqa: ANN401
    return pl.from_arrow(out.table).sort("rollout_id", "step")["token_status"].to_list()


def test_status_verified_unverified_mismatch_and_exact(smollm2_dir: Path, tmp_path: Path) -> None:
    q = [{"role": "user", "content": "What is 2+2?"}]
    a = [{"role": "assistant", "content": "4"}]
    traj = traj_of(Rollout("r", calls=[_call(q, a), Call(prompt=[1, 2], response=[3])], final_reward=1.0))
    retok = _retok(smollm2_dir, tmp_path)
    credit = CreditSettings(advantage="none")
    same = _retok(smollm2_dir, tmp_path).prompt_ids
    assert _statuses(build(traj, credit, now=NOW, retokenizer=retok, verifier=same)) == ["verified", "exact"]
    # no server answers (a closed port): unverified, and the endpoint stops asking after the first refusal
    down = TokenizeEndpoint("http://127.0.0.1:9", "m", timeout_s=1)
    out = build(traj, credit, now=NOW, retokenizer=retok, verifier=down)
    assert _statuses(out) == ["unverified", "exact"] and down.down
    assert out.token_status == {"unverified": 1, "exact": 1}
    # a server rendering another template: mismatch, left out and counted unless asked to train on it
    other = _retok(smollm2_dir, tmp_path, KEEPING).prompt_ids
    out = build(traj, credit, now=NOW, retokenizer=retok, verifier=other)
    assert _statuses(out) == ["exact"] and out.dropped["token_mismatch"] == 1
    assert out.token_status == {"mismatch": 1, "exact": 1}
    kept = build(
        traj, CreditSettings(advantage="none", train_token_mismatch=True), now=NOW, retokenizer=retok, verifier=other
    )
    assert _statuses(kept) == ["mismatch", "exact"] and "token_mismatch" not in kept.dropped


def test_exact_calls_are_checked_against_the_template_when_asked(smollm2_dir: Path, tmp_path: Path) -> None:
    """credit.check_exact_tokens: the engine's prompt ids against the policy template's rendering of the
    recorded request; a vLLM that rendered with another template makes a mismatch."""
    retok = _retok(smollm2_dir, tmp_path)
    q = [{"role": "user", "content": "What is 2+2?"}]
    a = [{"role": "assistant", "content": "4"}]
    ours, other = retok.prompt_ids(json.dumps(q)), _retok(smollm2_dir, tmp_path, KEEPING).prompt_ids(json.dumps(q))
    assert ours and other and ours != other
    calls = [
        Call(prompt=ours, response=[19, 2], messages_in=q, messages_out=a),
        Call(prompt=other, response=[19, 2], messages_in=q, messages_out=a),
    ]
    traj = traj_of(Rollout("e", calls=calls, final_reward=1.0))
    unchecked = build(traj, CreditSettings(advantage="none"), now=NOW, retokenizer=retok)
    assert _statuses(unchecked) == ["exact", "exact"]
    credit = CreditSettings(advantage="none", check_exact_tokens=True, train_token_mismatch=True)
    assert _statuses(build(traj, credit, now=NOW, retokenizer=lambda: retok)) == ["exact", "mismatch"]


def _two_turns(first_out: dict[str, Any], history_turn: dict[str, Any], extra: list[dict[str, Any]]) -> Rollout:
    q = [{"role": "user", "content": "What is 41 times 86?"}]
    second_in = [*q, history_turn, *extra]
    return Rollout(
        "m",
        calls=[_call(q, [first_out]), _call(second_in, [{"role": "assistant", "content": "3526"}])],
        final_reward=1.0,
    )


def test_merging_survives_templates_and_counts_why_not(smollm2_dir: Path, tmp_path: Path) -> None:
    credit = CreditSettings(advantage="none", merge_calls=True)
    # a tool call the agent sends back in other JSON spacing renders as the model wrote it: one transition
    call = {"id": "a", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "41*86"}'}}
    sent_back = {**call, "function": {**call["function"], "arguments": '{"expr":"41*86"}'}}
    tool_result = [{"role": "tool", "tool_call_id": "a", "content": "3526"}]
    traj = traj_of(
        _two_turns(
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "assistant", "content": None, "tool_calls": [sent_back]},
            tool_result,
        )
    )
    out = build(traj, credit, now=NOW, retokenizer=_retok(smollm2_dir, tmp_path))
    got = pl.from_arrow(out.table)
    assert got["merged_calls"].to_list() == [2] and out.merge_mismatches == 0
    assert 0 in got["loss_mask"][0].to_list()  # the tool result is an observation

    # reasoning the model generated, sent back in the content: kept by one template, stripped by another
    thought = {"role": "assistant", "content": "<think>41*86 is 3526</think>Let me check."}
    user = [{"role": "user", "content": "Sure?"}]
    traj = traj_of(_two_turns(thought, thought, user))
    keeping = build(traj, credit, now=NOW, retokenizer=_retok(smollm2_dir, tmp_path, KEEPING))
    assert pl.from_arrow(keeping.table)["merged_calls"].to_list() == [2]
    stripping = build(traj, credit, now=NOW, retokenizer=_retok(smollm2_dir, tmp_path, STRIPPING))
    assert pl.from_arrow(stripping.table)["merged_calls"].to_list() == [1, 1]
    assert stripping.merge_breaks == {"reasoning_stripped": 1}
    # reasoning_content stays in the response tokens as the model generated it (<think> text)
    as_field = {"role": "assistant", "content": "Let me check.", "reasoning_content": "41*86 is 3526"}
    traj = traj_of(_two_turns(as_field, as_field, user))
    out = build(traj, credit, now=NOW, retokenizer=_retok(smollm2_dir, tmp_path, STRIPPING))
    first = pl.from_arrow(out.table).sort("step")["response_ids"][0].to_list()
    assert (
        _retok(smollm2_dir, tmp_path).tokenizer.decode(first) == "<think>41*86 is 3526</think>Let me check.<|im_end|>"
    )
    assert out.merge_breaks == {"reasoning_stripped": 1}


def test_exact_tool_call_in_other_spacing_breaks_the_merge_as_reserialized(smollm2_dir: Path) -> None:
    """The engine's ids of a tool call written without spaces: the next prompt re-serializes it."""
    retok = Retokenizer(str(smollm2_dir))
    tok = retok.tokenizer
    q = [{"role": "user", "content": "What is 41 times 86?"}]
    prompt = retok.prompt_ids(json.dumps(q))
    assert prompt is not None
    raw = tok(
        '<tool_call>\n{"name":"calc","arguments":{"expr":"41*86"}}\n</tool_call><|im_end|>', add_special_tokens=False
    )
    call = {"id": "a", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "41*86"}'}}
    turn = {"role": "assistant", "content": None, "tool_calls": [call]}
    history = [*q, turn, {"role": "tool", "tool_call_id": "a", "content": "3526"}]
    second = retok.prompt_ids(json.dumps(history))
    assert second is not None
    calls = [
        Call(prompt=prompt, response=raw["input_ids"], messages_in=q, messages_out=[turn]),
        Call(prompt=second, response=tok("3526<|im_end|>", add_special_tokens=False)["input_ids"]),
    ]
    out = build(
        traj_of(Rollout("x", calls=calls, final_reward=1.0)),
        CreditSettings(advantage="none", merge_calls=True),
        now=NOW,
    )
    assert out.merge_breaks == {"tool_call_reserialized": 1}
    assert _statuses(out) == ["exact", "exact"]


@pytest.mark.parametrize("legacy", [True, False])
def test_calls_without_tools_column_still_build(smollm2_dir: Path, legacy: bool) -> None:
    """Trajectories from before calls carried `tools` (and legacy {role, content} rows) still retokenize."""
    msgs = (
        [{"role": "user", "content": "hi"}]
        if legacy
        else [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    )
    traj = traj_of(Rollout("l", calls=[_call(msgs, [{"role": "assistant", "content": "hello"}])], final_reward=1.0))
    out = build(traj, CreditSettings(advantage="none"), now=NOW, retokenizer=Retokenizer(str(smollm2_dir)))
    assert _statuses(out) == ["unverified"]
