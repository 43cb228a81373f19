"""The calculator as a function tool, its schema, and the worked example every agent is shown.

SmolLM2-135M calls a tool only when shown how, so each history starts with one solved task: the
assistant's tool call, the tool's result, the final answer. Each framework writes that history in
its own message types; ``WORKED_EXAMPLE`` is the OpenAI chat form they are made from.
"""

from __future__ import annotations

import re

from examples.math_agent.calculator import CalcError, evaluate, format_number

AGENT_SYSTEM_PROMPT = (
    "You solve math problems. Call the calculate tool for every calculation. "
    "When you know the final number, reply with `ANSWER: <number>`."
)
TOOL_NAME = "calculate"
TOOL_DESCRIPTION = "Evaluate an arithmetic expression such as 12 * 34 and return the result."
CALCULATE_TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression to evaluate."}},
            "required": ["expression"],
        },
    },
}
EXAMPLE_QUESTION = "What is 23 times 47?"
EXAMPLE_CALL_ID = "call_example"
EXAMPLE_ARGUMENTS = '{"expression": "23 * 47"}'
EXAMPLE_RESULT = "1081"
EXAMPLE_ANSWER = "ANSWER: 1081"
WORKED_EXAMPLE: list[dict[str, object]] = [
    {"role": "user", "content": EXAMPLE_QUESTION},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": EXAMPLE_CALL_ID, "type": "function", "function": {"name": TOOL_NAME, "arguments": EXAMPLE_ARGUMENTS}}
        ],
    },
    {"role": "tool", "tool_call_id": EXAMPLE_CALL_ID, "content": EXAMPLE_RESULT},
    {"role": "assistant", "content": EXAMPLE_ANSWER},
]


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 34 and return the result.

    A bad expression is answered with an error text, not raised: the model sees its mistake as the
    tool's result, and the call stays in its training data.
    """
    try:
        return format_number(evaluate(expression))
    except CalcError as exc:
        return f"error: {exc}"


_ANSWER = re.compile(r"ANSWER:\s*(-?[\d,]+(?:\.\d+)?)")


def final_answer(text: str | None) -> str | None:
    """The number after ``ANSWER:`` in the agent's last reply, if any."""
    found = _ANSWER.search(text or "")
    return found.group(1).replace(",", "") if found else None
