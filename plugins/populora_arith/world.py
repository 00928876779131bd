"""The arithmetic world's grammar, difficulty and text formats: pure Python, shared by the task, the held-out
evaluator and the base model's build (``benchmarks/research/arith``).

A problem is ``a+b`` with non-negative integers of at most :data:`MAX_DIGITS` digits, no leading zeros. Its level
(the difficulty a teacher controls by what it writes) is the digit count of the longer operand, 1 to
:data:`MAX_DIGITS`. Answers are written least significant digit first ("reversed"): small transformers learn
addition in that order from far fewer examples (Lee et al., ICLR 2024), so a base of nano's size can be partly
capable at the middle levels and incapable at the top ones, leaving a curriculum something to teach.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

#: Operands have at most this many digits; levels are 1..MAX_DIGITS.
MAX_DIGITS = 6
LEVELS = tuple(range(1, MAX_DIGITS + 1))
#: Every character the world writes (the base's vocabulary, besides its special tokens).
ALPHABET = "0123456789+=;>"
#: What ends a proposal: the proposer writes one question and stops.
PROPOSAL_STOP = ";"
_QUESTION = re.compile(r"(\d+)\+(\d+)")


def level(a: int, b: int) -> int:
    """The difficulty of ``a+b``: the digit count of the longer operand."""
    return max(len(str(a)), len(str(b)))


def carries(a: int, b: int) -> str:
    """Which columns carry, least significant first ("0110"): with the level, a problem's shape (its signature,
    what problem-space coverage counts)."""
    out, carry = [], 0
    for column in range(level(a, b)):
        carry = int((a // 10**column) % 10 + (b // 10**column) % 10 + carry >= 10)
        out.append(str(carry))
    return "".join(out)


def question(a: int, b: int) -> str:
    return f"{a}+{b}"


def parse_question(text: str) -> tuple[int, int]:
    """``(a, b)`` of a well-formed question; ``ValueError`` saying what is wrong (the task counts the reasons)."""
    text = text.strip()
    match = _QUESTION.fullmatch(text)
    if match is None:
        raise ValueError("not a+b")
    operands = match.groups()
    if any(len(x) > 1 and x.startswith("0") for x in operands):
        raise ValueError("leading zero")
    if any(len(x) > MAX_DIGITS for x in operands):
        raise ValueError(f"over {MAX_DIGITS} digits")
    return int(operands[0]), int(operands[1])


def answer(a: int, b: int) -> str:
    """The answer as the student writes it: the sum's digits, least significant first."""
    return str(a + b)[::-1]


def solver_prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def proposer_prompt(references: Sequence[tuple[int, int]]) -> str:
    """Reference questions (from the task's buffer), then ``>``: the proposer writes a new question and ``;``."""
    return ";".join(question(a, b) for a, b in references) + ">"


def draw(level_: int, rng: random.Random) -> tuple[int, int]:
    """A uniform problem of ``level_``: the longer operand has exactly that many digits (either side), the other
    any count up to it."""
    low = 0 if level_ == 1 else 10 ** (level_ - 1)
    longer = rng.randrange(low, 10**level_)
    other = rng.randrange(0, 10 ** rng.randint(1, level_))
    return (longer, other) if rng.random() < 0.5 else (other, longer)
