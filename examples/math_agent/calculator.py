"""The agent's tool: a safe arithmetic evaluator and the parser for its replies."""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


class CalcError(ValueError):
    """The expression is not plain arithmetic."""


def evaluate(expression: str) -> float:
    """Evaluate + - * / // % and parentheses on numbers; anything else is refused.

    Like a desk calculator, it reads the expression up to an ``=`` the model may have added
    (``28 * 21 = 568`` computes ``28 * 21``) and ignores a trailing full stop.
    """
    expression = expression.split("=", 1)[0].strip().rstrip(".").strip()
    expression = expression.replace("x", "*").replace("×", "*").replace("÷", "/").strip()
    if len(expression) > 200:
        raise CalcError("expression too long")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"not an expression: {expression!r}") from exc

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Mult) and abs(left) * abs(right) > 1e15:
                raise CalcError("result too large")
            try:
                return _OPS[type(node.op)](left, right)
            except ZeroDivisionError as exc:
                raise CalcError("division by zero") from exc
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise CalcError(f"unsupported syntax in {expression!r}")

    return walk(tree)


def format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


@dataclass(frozen=True)
class Reply:
    """What the model asked for: a calculation, a final answer, or neither."""

    calc: str | None = None
    answer: str | None = None


_CALC = re.compile(r"CALC:\s*([^\n]+)")
_ANSWER = re.compile(r"ANSWER:\s*(-?[\d,]+(?:\.\d+)?)")


def parse_reply(text: str) -> Reply:
    """The first CALC or ANSWER line, whichever comes first."""
    calc, answer = _CALC.search(text), _ANSWER.search(text)
    if calc and (not answer or calc.start() < answer.start()):
        return Reply(calc=calc.group(1).strip().strip("`"))
    if answer:
        return Reply(answer=answer.group(1).replace(",", ""))
    return Reply()


NUDGE = "Use CALC: <expression> or give ANSWER: <number>."


def respond(reply: Reply) -> str:
    """The user turn after a reply with no final answer: the calculator's ``RESULT:``, or a nudge to the protocol."""
    if reply.calc is None:
        return NUDGE
    try:
        return f"RESULT: {format_number(evaluate(reply.calc))}"
    except CalcError as exc:
        return f"RESULT: error ({exc})"


def is_correct(answer: str | None, gold: int) -> bool:
    if answer is None:
        return False
    try:
        return abs(float(answer) - gold) < 1e-6
    except ValueError:
        return False
