"""Calc-X style word problems with exact integer answers, generated from a seed.

Each task needs one or two calculator calls; the prompt carries one worked example because
SmolLM2-135M uses the tool only when shown how (see DESIGN.md, "Learning signal").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = ["Maria", "Omar", "Lena", "Kenji", "Ada", "Tomas", "Priya", "Sam"]
ITEMS = ["pens", "apples", "books", "tickets", "cups", "boxes", "plants", "stamps"]


@dataclass(frozen=True)
class MathTask:
    task_id: str
    question: str
    answer: int


def _multiply(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    return f"What is {a} times {b}?", a * b


def _buy(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    price, count = rng.randint(3, 29), rng.randint(11, 48)
    return f"{name} buys {count} {item} at {price} dollars each. How many dollars does {name} pay?", price * count


def _change(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    price, count = rng.randint(3, 19), rng.randint(11, 29)
    paid = (price * count // 100 + 1) * 100
    return (
        f"{name} buys {count} {item} at {price} dollars each and pays with {paid} dollars. "
        f"How many dollars of change does {name} get?",
        paid - price * count,
    )


def _share(rng: random.Random) -> tuple[str, int]:
    item = rng.choice(ITEMS)
    people, each, extra = rng.randint(3, 9), rng.randint(12, 40), rng.randint(5, 60)
    return (
        f"There are {people * each + extra} {item}. {extra} are set aside and the rest are shared equally "
        f"among {people} people. How many {item} does each person get?",
        each,
    )


# The held-out kinds (examples/closed_loop/agents.py): the same two problems as multiply and buy, with larger
# numbers (more digits to copy into the calculator and back) and other names, items and wording, so the base
# policy has headroom on them while what training teaches (write CALC, copy RESULT) still transfers.
OTHER_NAMES = ["Ravi", "Chloe", "Mateo", "Yuki", "Noor", "Felix", "Amara", "Jonas"]
OTHER_ITEMS = ["chairs", "lamps", "bottles", "shirts", "bricks", "candles", "tiles", "kites"]


def _multiply_large(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(1001, 9999), rng.randint(13, 99)
    name, item = rng.choice(OTHER_NAMES), rng.choice(OTHER_ITEMS)
    template = rng.choice(
        [
            "A crate holds {a} {item}. How many {item} are in {b} crates?",
            "{name} packs {b} boxes with {a} {item} in each box. How many {item} does {name} pack?",
            "What is the product of {a} and {b}?",
        ]
    )
    return template.format(a=a, b=b, name=name, item=item), a * b


def _buy_large(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(OTHER_NAMES), rng.choice(OTHER_ITEMS)
    price, count = rng.randint(13, 99), rng.randint(101, 999)
    template = rng.choice(
        [
            "{name} orders {count} {item}. Each one costs {price} dollars. What is the total cost in dollars?",
            "A shop sells {item} for {price} dollars each. {name} buys {count} of them. How many dollars is that?",
            "{name} buys {count} {item} at {price} dollars each. How many dollars does {name} pay?",
        ]
    )
    return template.format(name=name, item=item, price=price, count=count), price * count


GENERATORS = (_multiply, _buy, _change, _share)
KINDS: dict[str, object] = {
    "multiply": _multiply,
    "buy": _buy,
    "change": _change,
    "share": _share,
    "multiply_large": _multiply_large,
    "buy_large": _buy_large,
}


def make_tasks(
    n: int, *, seed: int, prefix: str = "math", kinds: tuple[str, ...] = ("multiply", "buy", "change", "share")
) -> list[MathTask]:
    """``n`` tasks cycling through ``kinds``, the same for the same seed; ids are stable (GRPO groups)."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown task kinds {unknown}; choose from {', '.join(KINDS)}")
    generators = [KINDS[k] for k in kinds]
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        question, answer = generators[i % len(generators)](rng)  # type: ignore[operator]
        tasks.append(MathTask(task_id=f"{prefix}-{seed}-{i}", question=question, answer=answer))
    return tasks


SYSTEM_PROMPT = (
    "You solve math problems with a calculator. To calculate, write exactly one line "
    "`CALC: <expression>` and stop; you will get `RESULT: <value>`. "
    "When you know the final number, write `ANSWER: <number>`."
)

WORKED_EXAMPLE: list[dict[str, str]] = [
    {"role": "user", "content": "Ali buys 14 pens at 23 dollars each. How many dollars does Ali pay?"},
    {"role": "assistant", "content": "CALC: 14 * 23"},
    {"role": "user", "content": "RESULT: 322"},
    {"role": "assistant", "content": "ANSWER: 322"},
]


def initial_messages(task: MathTask) -> list[dict[str, str]]:
    """The chat a rollout starts from: instructions, one worked example, the question."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        *WORKED_EXAMPLE,
        {"role": "user", "content": task.question},
    ]
