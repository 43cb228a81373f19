"""Redaction of span text: generated emails and keys never survive, text without them never changes."""

from __future__ import annotations

import json
import string
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.bronze.redact import BUILTIN, JSON_COLUMNS, REDACTED_COLUMN, Redactor, marker, redact_spans
from schemas.config import RedactionSettings, load_settings
from schemas.errors import ConfigError
from schemas.tables import SPANS

ALL = Redactor(RedactionSettings(default=["email", "api_key", "phone"]))
DEFAULT = Redactor(RedactionSettings())  # email and api_key

alnum = string.ascii_letters + string.digits
openai_keys = st.builds(
    lambda prefix, body: prefix + body,
    st.sampled_from(["sk-", "sk-proj-", "sk-ant-api03-"]),
    st.text(alnum + "_-", min_size=20, max_size=64),
)
bearer_tokens = st.builds(
    lambda word, head, digit, tail: f"{word} {head}{digit}{tail}",
    st.sampled_from(["Bearer", "bearer", "BEARER"]),
    st.text(alnum + "._-", min_size=8, max_size=30),
    st.sampled_from(string.digits + "._-"),
    st.text(alnum + "._~+/-", min_size=8, max_size=40),
)
aws_keys = st.builds(
    lambda prefix, body: prefix + body,
    st.sampled_from(["AKIA", "ASIA"]),
    st.text(string.ascii_uppercase + string.digits, min_size=16, max_size=16),
)
github_tokens = st.builds(lambda body: "ghp_" + body, st.text(alnum, min_size=36, max_size=40))
secrets = st.one_of(openai_keys, bearer_tokens, aws_keys, github_tokens)
emails = st.emails()
# Prose: any text, quotes, backslashes, newlines and non-ASCII included; the separators below end a
# secret the way whitespace or punctuation does in real text.
prose = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
separators = st.sampled_from([" ", "\n", ", ", "; ", " (", ") ", "\t", ' "', '" '])


def clean_text() -> st.SearchStrategy[str]:
    """Text no detector matches."""
    return prose.filter(lambda t: not any(d.pattern.search(t) for d in BUILTIN.values()))


@st.composite
def mixed(draw: st.DrawFn) -> tuple[str, list[str], list[str], str]:
    """Prose with emails and secrets woven in: (text, the emails, the secrets, the text redaction must give)."""
    found_emails = draw(st.lists(emails, max_size=3))
    found_secrets = draw(st.lists(secrets, max_size=3))
    parts = [(e, marker("email")) for e in found_emails] + [(k, marker("api_key")) for k in found_secrets]
    parts += [(p, p) for p in draw(st.lists(clean_text(), min_size=1, max_size=4))]
    text = expected = ""
    for original, redacted in draw(st.permutations(parts)):
        sep = draw(separators)
        text += sep + original
        expected += sep + redacted
    sep = draw(separators)
    return text + sep, found_emails, found_secrets, expected + sep


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed())
def test_every_generated_email_and_key_is_gone(case: tuple[str, list[str], list[str], str]) -> None:
    text, found_emails, found_secrets, expected = case
    out, names = DEFAULT.text(text, "default")
    for s in [*found_emails, *found_secrets]:
        assert s not in out
    # exactly each one replaced by its marker: nothing of it left, nothing around it taken
    assert out == expected
    assert names == ({"email"} if found_emails else set()) | ({"api_key"} if found_secrets else set())


@settings(max_examples=300, deadline=None)
@given(clean_text())
def test_text_without_them_is_unchanged(text: str) -> None:
    assert ALL.text(text, "default") == (text, set())
    doc = json.dumps([{"role": "user", "content": text}, {"k": [text, 1, None, True, 2.5]}])
    assert ALL.json_text(doc, "default") == (doc, set())


def span_row(i: int, tenant: str, text: str, attr: str, status: str | None = None) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "trace_id": f"{i:032x}",
        "span_id": f"{i:016x}",
        "name": "llm.call",
        "start_time": 0,
        "rollout_id": f"r{i}",
        "input_messages": json.dumps([{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]),
        "output_messages": json.dumps([{"role": "assistant", "content": [{"type": "text", "text": text}]}]),
        "tools": json.dumps([{"type": "function", "function": {"name": "notify", "description": attr}}]),
        "attributes": json.dumps({"gen_ai.request.temperature": 0.8, "user": {"note": attr, "n": 3}}),
        "resource_attributes": json.dumps({"service.name": "agent"}),
        "status_message": status,
        "day": 0,
    }


def spans_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SPANS)


def cells(table: pa.Table, i: int) -> list[str]:
    return [v for c in (*JSON_COLUMNS, "status_message") if (v := table.column(c)[i].as_py()) is not None]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(mixed(), mixed(), st.booleans()), min_size=1, max_size=6))
def test_spans_table_redacts_every_text_column(rows: list[tuple[Any, Any, bool]]) -> None:
    table = spans_table([span_row(i, "default", a[0], b[0], a[0] if s else None) for i, (a, b, s) in enumerate(rows)])
    out = redact_spans(table, DEFAULT)
    assert out.num_rows == table.num_rows and out.schema.field(REDACTED_COLUMN).type == pa.list_(pa.string())
    for i, ((_, e1, s1, x1), (_, e2, s2, x2), _) in enumerate(rows):
        for c in cells(out, i):
            for s in [*e1, *s1, *e2, *s2]:
                assert s not in c
        expect = sorted({"email"} if e1 or e2 else set()) + (["api_key"] if s1 or s2 else [])
        assert sorted(out.column(REDACTED_COLUMN)[i].as_py()) == sorted(expect)
        # still JSON of the same shape: roles, numbers and keys kept
        msgs = json.loads(out.column("input_messages")[i].as_py())
        assert [m["role"] for m in msgs] == ["system", "user"] and msgs[0]["content"] == "be brief"
        assert msgs[1]["content"] == x1
        attrs = json.loads(out.column("attributes")[i].as_py())
        assert attrs["gen_ai.request.temperature"] == 0.8 and attrs["user"] == {"note": x2, "n": 3}
        (tool,) = json.loads(out.column("tools")[i].as_py())  # a tool's description is text a user wrote too
        assert tool == {"type": "function", "function": {"name": "notify", "description": x2}}
    # columns redaction does not read are the same arrays
    for name in ("trace_id", "rollout_id", "prompt_token_ids", "day"):
        assert out.column(name).equals(table.column(name))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(clean_text(), clean_text()), min_size=1, max_size=6))
def test_spans_table_without_them_is_unchanged(rows: list[tuple[str, str]]) -> None:
    table = spans_table([span_row(i, "default", a, b, a or None) for i, (a, b) in enumerate(rows)])
    out = redact_spans(table, ALL)
    assert out.schema.names == table.schema.names  # a `spans` table (v3) has the column: filled in place
    assert out.drop_columns([REDACTED_COLUMN]).equals(table.drop_columns([REDACTED_COLUMN]))
    assert out.column(REDACTED_COLUMN).to_pylist() == [[] for _ in rows]


def test_per_tenant_detectors_and_named_patterns() -> None:
    rules = RedactionSettings(
        default=["email"],
        tenants={"open": [], "support": ["email", "phone", "ticket"]},
        patterns={"ticket": r"TICKET-\d{4,}"},
    )
    text = "mail ann@example.com, call +44 20 7946 0958 about TICKET-12345 with sk-abcdefghijklmnopqrstuv"
    table = spans_table(
        [
            span_row(1, "default", text, "x"),
            span_row(2, "open", text, "x"),
            span_row(3, "support", text, "x"),
        ]
    )
    out = redact_spans(table, Redactor(rules))
    user = [json.loads(v)[1]["content"] for v in out.column("input_messages").to_pylist()]
    assert user[0] == text.replace("ann@example.com", marker("email"))
    assert user[1] == text  # this tenant asked for no redaction
    assert user[2] == (
        text.replace("ann@example.com", marker("email"))
        .replace("+44 20 7946 0958", marker("phone"))
        .replace("TICKET-12345", marker("ticket"))
    )
    assert out.column(REDACTED_COLUMN).to_pylist() == [["email"], [], ["email", "phone", "ticket"]]
    assert out.column("input_messages")[1].as_py() == table.column("input_messages")[1].as_py()


@pytest.mark.parametrize(
    "text",
    [
        "the 2026-11-23 12:00 run, 3.14159, order 123456789",
        "risk-assessment-framework-for-teams and task-sk-like-words",
        "bearer instruments and a bearer of news",
        "an @mention and user@localhost",
    ],
)
def test_common_text_is_not_redacted(text: str) -> None:
    assert ALL.text(text, "default") == (text, set())


def test_secrets_of_each_kind() -> None:
    cases = {
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N": "api_key",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY": "api_key",
        "token xoxb-123456789012-abcdefghijkl": "api_key",
        "key AIzaSyA1234567890abcdefghijklmnopqrstuv": "api_key",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----": "api_key",
        "call (415) 555-0100 today": "phone",
    }
    for text, name in cases.items():
        out, names = ALL.text(text, "default")
        assert names == {name}, text
        assert marker(name) in out


def test_redaction_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="unknown detector nope"):
        load_settings(environ={}, discover=False, overrides={"redaction": {"tenants": {"a": ["nope"]}}})
    with pytest.raises(ConfigError, match="not a regular expression"):
        load_settings(environ={}, discover=False, overrides={"redaction": {"patterns": {"x": "("}}})
    with pytest.raises(ConfigError, match="built-in"):
        load_settings(environ={}, discover=False, overrides={"redaction": {"patterns": {"email": "x"}}})
    s = load_settings(environ={}, discover=False)
    assert s.redaction.detectors("anyone") == ["email", "api_key"]
