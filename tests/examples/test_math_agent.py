"""The math agent's pure parts: tasks, the calculator and reply parsing."""

from __future__ import annotations

import pytest

from examples.math_agent.calculator import CalcError, evaluate, is_correct, parse_reply
from examples.math_agent.tasks import make_tasks


def test_tasks_are_deterministic_and_exact() -> None:
    a, b = make_tasks(20, seed=3), make_tasks(20, seed=3)
    assert a == b
    assert len({t.task_id for t in a}) == 20
    for t in a:
        assert isinstance(t.answer, int) and t.answer >= 0


@pytest.mark.parametrize(
    ("expr", "value"), [("14 * 23", 322), ("(130 - 58) / 6", 12), ("7x6", 42), ("-3 + 5", 2), ("28 * 21 = 568.", 588)]
)
def test_calculator(expr: str, value: float) -> None:
    assert evaluate(expr) == value


@pytest.mark.parametrize("expr", ["__import__('os')", "2 ** 99999", "1/0", "abs(3)", "9" * 300, "1e300 * 1e300"])
def test_calculator_refuses(expr: str) -> None:
    with pytest.raises(CalcError):
        evaluate(expr)


def test_parse_reply_takes_the_first_action() -> None:
    assert parse_reply("CALC: 2*3\nANSWER: 6").calc == "2*3"
    assert parse_reply("So ANSWER: 1,234.").answer == "1234"
    assert parse_reply("I think it is six").calc is None
    assert is_correct("322", 322) and not is_correct("321", 322) and not is_correct(None, 1)
