"""What the judge is shown, what it must answer, and how the answer becomes rewards (pure functions).

The judge sees a group of trajectories side by side (RULER's relative judging: a model ranks
answers to one task far more reliably than it grades one on an absolute scale) and answers one JSON
object, a score per trajectory by its number in the prompt:

    {"1": {"reason": "...", "score": 0.8}, "2": {"reason": "...", "score": 0.1}}

Only the order of the scores is used: each member's reward is its mid-rank in the group, scaled to
[0, 1] (the best 1, the worst 0, ties share), so a judge that scores everything high or compresses
its scale gives the same rewards as one that spreads them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pipelines.errors import JudgeAnswerError
from schemas.messages import parse_messages

# Bump when the prompt's wording or the answer's format changes: it is part of every judgement's key,
# so a changed prompt is a new question and is asked again.
PROMPT_VERSION = "1"
_REASON_CHARS = 120  # the most the judge may say about one trajectory (a small model would ramble on)


def _content(value: Any) -> str:
    if isinstance(value, list):  # content parts
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, Mapping))
    return "" if value is None else str(value)


def conversation(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The trajectory's conversation: its last call's input (tool results included) and output.

    An agent sends its history with every call, so the last call holds the whole exchange.
    """
    calls = row.get("calls") or []
    if not calls:
        return []
    last = calls[-1]
    return parse_messages(last.get("input_messages")) + parse_messages(last.get("output_messages"))


def cut(text: str, max_chars: int) -> str:
    """``text`` within ``max_chars``: its head (the task) and tail (the answer) kept, the middle cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 5
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


def render(row: Mapping[str, Any], max_chars: int) -> str:
    """One trajectory as the judge reads it: its status and its messages, system prompts left out
    (they are the same for every member and cost room the answers need)."""
    lines = [f"status: {row.get('status')}"]
    for m in conversation(row):
        role = str(m.get("role") or "unknown")
        if role == "system":
            continue
        text = _content(m.get("content"))
        for call in m.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(fn, Mapping):
                text += f"\n(calls {fn.get('name')}({fn.get('arguments')}))"
        lines.append(f"[{role}] {text.strip()}")
    return cut("\n".join(lines), max_chars)


def task_of(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The task the group shares (its task id), or None for a window of one agent's different tasks."""
    tasks = {r.get("task_id") for r in rows}
    return next(iter(tasks)) if len(tasks) == 1 and None not in tasks else None


def build_messages(rubric: str, rows: Sequence[Mapping[str, Any]], *, max_chars: int) -> list[dict[str, str]]:
    """The chat messages that ask the judge to score ``rows`` (numbered 1..n in this order) by ``rubric``."""
    n = len(rows)
    task = task_of(rows)
    about = (
        f"All {n} trajectories are attempts at the same task ({task})."
        if task
        else f"The {n} trajectories are one agent's recent runs, each on its own task."
    )
    system = (
        "You judge the work of an AI agent. You are shown several trajectories (conversations between a "
        "user, the agent, and the tools it called) and score each from 0 (worst) to 1 (best) against the "
        "rubric, comparing them with each other.\n\n"
        f"Rubric:\n{rubric.strip()}\n\n"
        "Answer with one JSON object and nothing else. Its keys are the trajectory numbers as strings, "
        '"1" to "' + str(n) + '"; each value is {"reason": <one short sentence>, "score": <a number from 0 to 1>}.'
    )
    body = [about, ""]
    for i, row in enumerate(rows, start=1):
        body += [f'<trajectory id="{i}">', render(row, max_chars), "</trajectory>", ""]
    body.append(f'Score trajectories "1" to "{n}" as one JSON object.')
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(body)}]


def retry_messages(messages: Sequence[Mapping[str, str]], answer: str, why: str, n: int) -> list[dict[str, str]]:
    """``messages`` followed by the judge's unusable ``answer`` and what was wrong with it: the one retry."""
    fix = (
        f"That answer cannot be used: {why}. Answer again with only one JSON object whose keys are "
        f'"1" to "{n}", each value {{"reason": <one short sentence>, "score": <a number from 0 to 1>}}.'
    )
    return [*map(dict, messages), {"role": "assistant", "content": answer[:2000]}, {"role": "user", "content": fix}]


def answer_schema(n: int) -> dict[str, Any]:
    """The JSON schema of a valid answer for ``n`` trajectories (for a server that constrains output to it)."""
    member = {
        "type": "object",
        "properties": {
            "reason": {"type": "string", "maxLength": _REASON_CHARS},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["reason", "score"],
        "additionalProperties": False,
    }
    keys = [str(i) for i in range(1, n + 1)]
    return {
        "type": "object",
        "properties": dict.fromkeys(keys, member),
        "required": keys,
        "additionalProperties": False,
    }


def _object_in(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (code fences and chatter around it allowed)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    raise JudgeAnswerError("it holds no JSON object")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _numbered(value: dict[str, Any] | list[Any]) -> dict[int, Any]:
    """Entries by trajectory number: keys with digits in them (``"2"``, ``"trajectory 2"``), or list positions."""
    if isinstance(value, list):
        return {i: v for i, v in enumerate(value, start=1)}
    out: dict[int, Any] = {}
    for key, entry in value.items():
        digits = "".join(c for c in str(key) if c.isdigit())
        if digits:
            out.setdefault(int(digits), entry)
    return out


def parse(text: str, n: int) -> list[tuple[float, str]]:
    """(score, reason) for each of the ``n`` trajectories, in order; ``JudgeAnswerError`` says what is missing.

    Lenient in form (text around the object, ``"trajectory 2"`` for ``"2"``, a bare number for
    ``{"score": ...}``, a ``{"scores": {...}}`` wrapper, an answer cut off by the token limit after the
    last score), strict in substance: every trajectory needs a finite score.
    """
    try:
        return _scores(_whole(text), n)
    except JudgeAnswerError as exc:
        salvaged = _salvaged(text)
        if salvaged and all(i in salvaged for i in range(1, n + 1)):
            return [(salvaged[i], "") for i in range(1, n + 1)]
        raise exc from None


def _whole(text: str) -> dict[int, Any]:
    obj = _object_in(text)
    by_number = _numbered(obj)
    if not by_number:  # a wrapper such as {"scores": {...}} or {"scores": [...]}
        inner = [v for v in obj.values() if isinstance(v, dict | list)]
        if len(inner) == 1:
            by_number = _numbered(inner[0])
    return by_number


def _scores(by_number: dict[int, Any], n: int) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    missing: list[str] = []
    for i in range(1, n + 1):
        value = by_number.get(i)
        reason = ""
        if isinstance(value, Mapping):
            reason = str(value.get("reason") or value.get("explanation") or "")
            value = value.get("score")
        score = _number(value)
        if score is None:
            missing.append(str(i))
            continue
        out.append((score, reason[: _REASON_CHARS * 2]))
    if missing:
        raise JudgeAnswerError(f"no numeric score for trajectory {', '.join(missing)}")
    return out


_SCORE_AFTER_ID = re.compile(r'"(\d+)"\s*:\s*\{[^{}]*?"score"\s*:\s*(-?\d+(?:\.\d+)?)')


def _salvaged(text: str) -> dict[int, float]:
    """Scores found in an answer that is not whole JSON (cut off after its last score)."""
    out: dict[int, float] = {}
    for key, value in _SCORE_AFTER_ID.findall(text):
        out.setdefault(int(key), float(value))
    return out


def ranks(scores: Sequence[float]) -> list[float]:
    """Each score's mid-rank among ``scores``, scaled to [0, 1]: the best 1, the worst 0, ties equal.

    ``(below + (equal - 1) / 2) / (n - 1)``; a group of one is 0.5. Only the order matters, and the
    rewards of a group always average 0.5.
    """
    n = len(scores)
    if n == 1:
        return [0.5]
    out = []
    for s in scores:
        below = sum(1 for t in scores if t < s)
        equal = sum(1 for t in scores if t == s)
        out.append((below + (equal - 1) / 2) / (n - 1))
    return out
