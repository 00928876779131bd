"""Prompt builders and answer parsers for AZR's three code tasks, in two styles.

* ``azr`` reproduces the *structure* of AZR's R1-style prompts (a reasoning-then-answer preamble,
  ``User: ...`` / ``Assistant: <think>``, task header, requirements, formatting example, references in
  ``<snippet_i>`` tags). The wording is our own: it is reconstructed from a description, not copied.
* ``compact`` is a short, stable format for a tiny CPU model (and for the synthetic corpus that
  pretrains it). A proposer prompt shows every reference it is given, as AZR does (the caller draws
  them; :func:`fit_references` is the older rule that skipped references beyond a character budget,
  kept for ablations and the nano corpus); an induction solver prompt leaves out example pairs beyond
  ``max_chars`` (at least one is shown). The completion is just fenced blocks, optionally wrapped in
  ``<think>...</think><answer>...</answer>``.

The compact format, exactly (``{...}`` are placeholders, blocks separated by one newline)::

    [deduction:propose]                      <- or abduction:propose
    Write a new deterministic Python function f and one input for it.
    Reference 1:
    ```python\n{program}\n```
    ```input\n{input}\n```
    ```output\n{output}\n```
    ...
    Reply with a ```python block and an ```input block.
    Answer:

    completion: ```python\n{program}\n```\n```input\n{input}\n```

    [induction:propose]
    Write {n} different inputs for f, each in its own ```input block, and a ```message block hinting
    what f does.
    ```python\n{program}\n```
    Answer:

    completion: ```input\n{i1}\n``` ... ```input\n{in}\n```\n```message\n{message}\n```

    [deduction:solve]   program + ```input``` -> completion ```output\n{value}\n```
    [abduction:solve]   program + ```output``` -> completion ```input\n{args}\n```
    [induction:solve]   message + pairs (```input``` then ```output```) -> completion ```python\n{f}\n```

Build canonical completions with :func:`format_code_proposal`, :func:`format_induction_proposal` and
:func:`format_solver_answer`; parse them with :func:`parse_code_proposal`,
:func:`parse_induction_proposal` and :func:`parse_solver_answer`. Everything here is pure string work:
nothing is executed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

STYLES = ("azr", "compact")
TASK_TYPES = ("deduction", "abduction", "induction")

#: Default size budget of a compact induction solver prompt, in characters: < 512 tokens even for the
#: 512-entry test tokenizer (1.2-1.6 characters per token); a tokenizer trained on code packs far more. It
#: was also the proposer prompts' budget before issue 32 (what the nano corpus was written with).
COMPACT_MAX_CHARS = 600

#: Default budget of a compact deduction/abduction proposer prompt, in characters: the longest prompt the nano
#: model handles. It was trained on proposer prompts of at most 600 characters; in 4-step nano runs its
#: deduction proposals stay valid with 3 references shown (prompts of about 650 characters, 920 at most) and
#: mostly with 4 (about 810), while with AZR's 6 (about 1150) almost none are (plugins/populora_azr/README.md).
#: 900 characters are about 390 tokens at nano's densest 2.32 characters per token, far within its 768 positions.
COMPACT_PROPOSER_MAX_CHARS = 900

#: A typical compact reference, what recipe validation sizes K references by: a 90-character program with a
#: 10-character input and output (nano-written references average 90-110 characters of program; 3 and 6 of them
#: make prompts of 644 and 1150 characters on average, these 647 and 1148).
TYPICAL_REFERENCE: Reference = ("p" * 90, "i" * 10, "o" * 10)

Reference = tuple[str, str, str]  # (program, input, output)

#: AZR's zero triplet (the seed of every deduction/abduction buffer): the smallest reference a run shows.
ZERO_TRIPLET: Reference = ("def f(a):\n    return a", "'Hello world'", "'Hello world'")


class ParseError(ValueError):
    """A completion does not contain what the task needs (the proposal is invalid / answer wrong)."""


# --- small helpers -----------------------------------------------------------------------------------


def fence(label: str, body: str) -> str:
    """One fenced block: three backticks + label, the body, three backticks."""
    return f"```{label}\n{body.strip(chr(10))}\n```"


def _wrap(body: str, think: str | None) -> str:
    if think is None:
        return body
    return f"<think>{think}</think>\n<answer>\n{body}\n</answer>"


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"unknown prompt style {style!r} (known: {', '.join(STYLES)})")


# --- azr (R1-style) wrapper ------------------------------------------------------------------------------

_R1_PREAMBLE = (
    "The User gives a task and the Assistant completes it. The Assistant first reasons step by step "
    "in private and only then gives the result. The reasoning goes between <think> and </think>, the "
    "result between <answer> and </answer>, like this: <think> reasoning </think> <answer> result "
    "</answer>."
)


def r1_wrap(task_text: str) -> str:
    """AZR's raw-text wrapper: a preamble, ``User: task``, then ``Assistant: <think>`` to continue."""
    return f"{_R1_PREAMBLE}\nUser: {task_text}\nAssistant: <think>"


_AZR_CODE_RULES = (
    "Requirements for the code:\n"
    "- The entry point is a function named `f` that takes at least one argument and returns a value.\n"
    "- It must be deterministic: the same input always gives the same output.\n"
    "- Make it need several steps of reasoning and state tracking to follow.\n"
    "- Do not use randomness, dates or times, files, the network, printing or logging, or any other "
    "outside state.\n"
    "- It must finish within 10 seconds.\n"
    "- Put imports and any helper classes at the top; nothing may follow the final return of `f`."
)

_AZR_INPUT_RULES = (
    "Requirements for the input:\n"
    "- Give exactly one input: the arguments of `f`, separated by commas.\n"
    "- Quote strings; write other values as Python literals."
)

_AZR_FORMAT_EXAMPLE = (
    "Formatting: put the code in a python block and the input in an input block, for example\n"
    + fence("python", "def f(name: str, info: dict):\n    return f\"{name} is {info['age']}\"")
    + "\n"
    + fence("input", "'Ada', {'age': 36, 'city': 'London'}")
)


def _azr_references(refs: Sequence[Reference]) -> str:
    if not refs:
        return ""
    parts = ["\n### Reference Code Snippets:"]
    for i, (program, inp, out) in enumerate(refs):
        parts.append(
            f"<snippet_{i}>\n{fence('python', program)}\n{fence('input', inp)}\n{fence('output', out)}\n</snippet_{i}>"
        )
    return "\n".join(parts)


def _azr_code_proposer(kind: str, refs: Sequence[Reference], banned: Sequence[str]) -> str:
    if kind == "abduction":
        header = (
            "## Task: write a Python snippet and one input for it. Someone else will see only the "
            "snippet and its output and must find an input that produces that output. Treat it as a "
            "puzzle that tests reasoning. You may define custom classes at the top of the snippet."
        )
        # AZR swaps the "difficulty" bullet between the two proposer prompts; we keep that quirk.
        difficulty = "- Difficulty: predicting the output from the input should take real thought."
    else:
        header = (
            "## Task: write a Python snippet and one input for it. Someone else will see the snippet "
            "and the input and must work out the output. Treat it as a puzzle that tests reasoning. "
            "You may define custom classes at the top of the snippet."
        )
        difficulty = "- Difficulty: recovering an input from the output should take real thought."
    banned_line = ("- Forbidden anywhere, even in comments: " + ", ".join(banned)) if banned else ""
    criteria = "\n".join(
        x
        for x in (
            "### Evaluation criteria:",
            "- Executability: the code runs without errors.",
            difficulty,
            "- Creativity: clearly different from the reference snippets.",
            banned_line,
        )
        if x
    )
    body = "\n\n".join(
        [
            header,
            _AZR_CODE_RULES,
            _AZR_INPUT_RULES,
            _AZR_FORMAT_EXAMPLE,
            criteria,
            "First make a plan, then write the snippet and the input.",
        ]
    )
    return r1_wrap(body + _azr_references(refs))


# --- compact builders ---------------------------------------------------------------------------------------


def _compact_proposer_frame(task_type: str) -> tuple[str, str]:
    head = f"[{task_type}:propose]\nWrite a new deterministic Python function f and one input for it."
    return head, "Reply with a ```python block and an ```input block.\nAnswer:\n"


def _compact_reference(number: int, ref: Reference) -> str:
    program, inp, out = ref
    return f"Reference {number}:\n{fence('python', program)}\n{fence('input', inp)}\n{fence('output', out)}"


def compact_proposer_chars(references: Sequence[Reference], task_type: str = "deduction") -> int:
    """Length in characters of the compact proposer prompt that shows ``references`` (all of them)."""
    return len(code_proposer_prompt(task_type, references, style="compact"))


def fit_references(task_type: str, references: Sequence[Reference], max_chars: int) -> list[Reference]:
    """The references a compact proposer prompt of at most ``max_chars`` characters showed before issue 32
    (``references_fit: skip_long``): in order, each one that still fits; one that does not is skipped and a
    later, shorter one may still enter, so short programs are favoured. AZR shows every drawn reference."""
    head, tail = _compact_proposer_frame(task_type)
    shown: list[Reference] = []
    size = len(head) + len(tail) + 2
    for ref in references:
        block = _compact_reference(len(shown) + 1, ref)
        if size + len(block) + 1 > max_chars:
            continue
        shown.append(ref)
        size += len(block) + 1
    return shown


# --- public prompt builders -------------------------------------------------------------------------------


def code_proposer_prompt(
    task_type: str,
    references: Sequence[Reference],
    *,
    style: str = "compact",
    banned: Sequence[str] = (),
    max_chars: int | None = None,
) -> str:
    """Proposer prompt for ``deduction`` or ``abduction``: write ``f`` plus one input, given references.

    Every reference is shown, in order, whatever its length (AZR). ``max_chars`` (compact style only) applies
    the older rule instead: references that do not fit that many characters are skipped (:func:`fit_references`).
    """
    _check_style(style)
    if task_type not in ("deduction", "abduction"):
        raise ValueError(f"code_proposer_prompt is for deduction/abduction, not {task_type!r}")
    if style == "azr":
        return _azr_code_proposer(task_type, references, banned)
    shown = references if max_chars is None else fit_references(task_type, references, max_chars)
    head, tail = _compact_proposer_frame(task_type)
    return "\n".join([head, *(_compact_reference(i + 1, ref) for i, ref in enumerate(shown)), tail])


def induction_proposer_prompt(program: str, *, n_inputs: int, style: str = "compact") -> str:
    """Proposer prompt for ``induction``: ``n_inputs`` inputs for a given program, plus a message."""
    _check_style(style)
    if style == "compact":
        return (
            f"[induction:propose]\nWrite {n_inputs} different inputs for f, each in its own ```input "
            f"block, and a ```message block hinting what f does.\n{fence('python', program)}\nAnswer:\n"
        )
    body = "\n\n".join(
        [
            f"## Task: write {n_inputs} inputs for the Python function below that together give varied, "
            "revealing outputs, plus a message. A test subject will see some of the inputs with their outputs "
            "and your message, and must reconstruct the function.",
            "Requirements for the inputs:\n- Put each input in its own input block.\n"
            "- Each input is the arguments of `f`, comma-separated, strings quoted.",
            "Requirements for the message:\n- Put it in a message block; any form is fine (a hint, a "
            "riddle, a description) but it must not contain the code.",
            "Formatting, for example:\n"
            + fence("input", "'abc', 2")
            + "\n"
            + fence("input", "'xyz', 0")
            + "\n"
            + fence("message", "Think about how each letter moves."),
            "### Evaluation criteria:\n- Executability: every input runs without errors.\n"
            "- Coverage: the inputs exercise different behaviours.\n- Creativity: inputs are varied.\n"
            "- Challenging but not impossible to infer.",
            "First make a plan, then write the inputs and the message.",
            "### The function:\n" + fence("python", program + "\n\nf(<one of your inputs goes here>)"),
        ]
    )
    return r1_wrap(body)


def deduction_solver_prompt(program: str, input_text: str, *, style: str = "compact") -> str:
    """Solver prompt: given the program and the input, predict the output."""
    _check_style(style)
    if style == "compact":
        return (
            f"[deduction:solve]\nPredict the output of f for the input.\n{fence('python', program)}\n"
            f"{fence('input', input_text)}\nReply with an ```output block.\nAnswer:\n"
        )
    body = "\n\n".join(
        [
            "## Task: work out the output of the code below for the given input. Put the output in an output "
            "block; quote strings and write several returned values as a tuple.",
            "### Code:\n" + fence("python", program),
            "### Input:\n" + fence("input", input_text),
            "### Example answer:\n" + fence("output", "{'total': 3, 'items': ['a', 'b']}"),
        ]
    )
    return r1_wrap(body)


def abduction_solver_prompt(program: str, output_text: str, *, style: str = "compact") -> str:
    """Solver prompt: given the program and an output, give one input that produces it."""
    _check_style(style)
    if style == "compact":
        return (
            f"[abduction:solve]\nGive an input for which f returns the output.\n"
            f"{fence('python', program)}\n{fence('output', output_text)}\n"
            "Reply with an ```input block.\nAnswer:\n"
        )
    body = "\n\n".join(
        [
            "## Task: give one input for which the code below returns the given output. Put it in an input "
            "block: the arguments of `f`, comma-separated, strings quoted.",
            "### Code:\n" + fence("python", program),
            "### Output:\n" + fence("output", output_text),
            "### Answer format:\n" + fence("input", "arg1, arg2, ..."),
            "### Example answer:\n" + fence("input", "'hello', [1, 2]"),
        ]
    )
    return r1_wrap(body)


def induction_solver_prompt(
    pairs: Sequence[tuple[str, str]], message: str, *, style: str = "compact", max_chars: int = COMPACT_MAX_CHARS
) -> str:
    """Solver prompt: from example input/output pairs and the message, write ``f``.

    In the compact style, pairs that would push the prompt over ``max_chars`` are left out (at least
    one is always shown).
    """
    _check_style(style)
    if style == "compact":
        head = f"[induction:solve]\nWrite f that maps each input to its output.\n{fence('message', message)}"
        tail = "Reply with a ```python block.\nAnswer:\n"
        blocks: list[str] = []
        size = len(head) + len(tail) + 2
        for inp, out in pairs:
            block = f"{fence('input', inp)}\n{fence('output', out)}"
            if blocks and size + len(block) + 1 > max_chars:
                continue
            blocks.append(block)
            size += len(block) + 1
        return "\n".join([head, *blocks, tail])
    shown = "\n".join(f"{fence(f'input_{i}', inp)}\n{fence(f'output_{i}', out)}" for i, (inp, out) in enumerate(pairs))
    body = "\n\n".join(
        [
            "## Task: write a Python function that reproduces the hidden outputs of a secret function. You "
            "see some of its inputs with their outputs and a message from its author. Put your final code in "
            "a python block, and check it against every pair.",
            _AZR_CODE_RULES,
            "### Input and Output Pairs:\n" + shown,
            "### Message:\n" + fence("message", message),
            "### Example answer:\n" + fence("python", "def f(a):\n    return a"),
            "Remember: the function must be named `f`.",
        ]
    )
    return r1_wrap(body)


# --- canonical completions (what a perfect model writes; used by the synthetic corpus) -----------------


def format_code_proposal(program: str, input_text: str, think: str | None = None) -> str:
    return _wrap(f"{fence('python', program)}\n{fence('input', input_text)}", think)


def format_induction_proposal(inputs: Sequence[str], message: str, think: str | None = None) -> str:
    blocks = [fence("input", i) for i in inputs] + [fence("message", message)]
    return _wrap("\n".join(blocks), think)


_ANSWER_LABEL = {"deduction": "output", "abduction": "input", "induction": "python"}


def format_solver_answer(task_type: str, answer: str, think: str | None = None) -> str:
    return _wrap(fence(_ANSWER_LABEL[task_type], answer), think)


# --- parsing -----------------------------------------------------------------------------------------------

_FORMAT_RE = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_]*)[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)


def check_format(completion: str, style: str = "compact") -> bool:
    """AZR: the completion (after the prompt's ``<think>``) closes the think tag and has an answer.

    Compact: always well formed at this level; what matters is whether the blocks parse.
    """
    _check_style(style)
    if style == "compact":
        return True
    text = completion.strip()
    if not text.startswith("<think>"):
        text = "<think>" + text
    return _FORMAT_RE.match(text) is not None


def extract_answer(completion: str, style: str = "compact") -> str:
    """The text the task parses: after the last ``<answer>`` up to ``</answer>``.

    AZR: empty when there is no ``<answer>``. Compact: the whole completion (after ``</think>`` if any).
    """
    _check_style(style)
    start = completion.rfind("<answer>")
    if start < 0:
        if style == "azr":
            return ""
        end_think = completion.rfind("</think>")
        return completion[end_think + len("</think>") :] if end_think >= 0 else completion
    body = completion[start + len("<answer>") :]
    end = body.find("</answer>")
    return body if end < 0 else body[:end]


def fences(text: str) -> list[tuple[str, str]]:
    """Every fenced block as ``(label, body)``, in order; the label is lower-cased ('' for a bare fence)."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(text)]


@dataclass(frozen=True)
class CodeProposal:
    program: str
    input: str


def parse_code_proposal(completion: str, style: str = "compact") -> CodeProposal:
    """First python (or bare) block and first input block inside the answer (AZR ``code_location=first``)."""
    blocks = fences(extract_answer(completion, style))
    program = next((b for label, b in blocks if label in ("python", "py", "")), None)
    inp = next((b for label, b in blocks if label == "input"), None)
    if program is None or not program.strip():
        raise ParseError("no ```python block")
    if inp is None or not inp.strip():
        raise ParseError("no ```input block")
    return CodeProposal(program.strip("\n"), inp.strip())


_MSG_TAG_RE = re.compile(r"<message>(.*?)</message>", re.DOTALL)
_MSG_LINE_RE = re.compile(r"^\s*#\s*Message:\s*(.+)$", re.MULTILINE | re.IGNORECASE)


def parse_induction_proposal(completion: str, n_inputs: int, style: str = "compact") -> tuple[list[str], str]:
    """The last ``n_inputs`` input blocks and the message (message block, ``<message>`` or ``# Message:``)."""
    answer = extract_answer(completion, style)
    blocks = fences(answer)
    inputs = [b.strip() for label, b in blocks if label == "input" and b.strip()]
    if len(inputs) < n_inputs:
        raise ParseError(f"{len(inputs)} ```input blocks, need {n_inputs}")
    message = next((b.strip() for label, b in blocks if label == "message"), None)
    if message is None:
        tag = _MSG_TAG_RE.search(answer)
        line = _MSG_LINE_RE.search(answer)
        message = tag.group(1).strip() if tag else (line.group(1).strip() if line else None)
    if not message:
        raise ParseError("no message")
    return inputs[-n_inputs:], message


def _solver_value(answer: str, label: str) -> str | None:
    """AZR's fallback chain for an input/output answer (paraphrased, see reference section 1)."""
    blocks = fences(answer)
    hit = next((b for lab, b in blocks if lab == label), None)
    if hit is not None:
        return hit.strip()
    m = re.search(rf"^\s*#\s*{label}:\s*(.+)$", answer, re.MULTILINE | re.IGNORECASE)
    if m:
        return m.group(1).strip()
    m = re.search(rf"\b{label}\((.*)\)", answer, re.DOTALL)
    if m:
        return m.group(1).strip()
    m = re.search(rf"<{label}>(.*?)</{label}>", answer, re.DOTALL)
    if m:
        return m.group(1).strip()
    m = re.search(rf"the {label} is[:\s]+(.+)", answer, re.IGNORECASE | re.DOTALL)
    if m:
        return m.group(1).strip().rstrip(".")
    return answer.strip() or None


def parse_solver_answer(task_type: str, completion: str, style: str = "compact") -> str | None:
    """The solver's answer text (an input, an output, or a program), or None when there is none.

    Deduction/abduction use AZR's fallback chain (fence, ``# Output:`` line, ``output(...)``, tags,
    "the output is", whole answer). Induction takes the last python (or bare) block.
    """
    answer = extract_answer(completion, style)
    if task_type == "induction":
        progs = [b for label, b in fences(answer) if label in ("python", "py", "")]
        return progs[-1].strip("\n") if progs and progs[-1].strip() else None
    if task_type not in _ANSWER_LABEL:
        raise ValueError(f"unknown task type {task_type!r}")
    return _solver_value(answer, _ANSWER_LABEL[task_type])


def has_answer_block(task_type: str, completion: str, style: str = "compact") -> bool:
    """Whether the answer holds the block the solver was asked for (the compact format check)."""
    labels = ("python", "py", "") if task_type == "induction" else (_ANSWER_LABEL[task_type],)
    return any(label in labels and body.strip() for label, body in fences(extract_answer(completion, style)))
