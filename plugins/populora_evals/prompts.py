"""Prompt templates and answer extraction, following AZR's evaluation protocol.

* ``azr``: the DeepSeek-R1 instruction paragraph, ``User: {question}``, ``Assistant: <think>``; the
  answer is read from ``<answer>...</answer>`` (then a ``\\boxed{}`` or code block inside it).
* ``azr_boxed``: the same, telling the model the final answer is read from ``\\boxed{}`` (AZR-Coder-7B).
* ``qwen-boxed``: Qwen's chat markup asking for step-by-step reasoning and a ``\\boxed{}`` answer; what
  AZR's maintainers use for non-AZR base models.
* ``evalplus`` (code): EvalPlus's default instruction and response prefix, ending inside a python code
  fence, which is what AZR's HumanEval+/MBPP+ script actually ran.
"""

from __future__ import annotations

import re

R1_PREFIX = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
    "</answer>."
)
BOXED_NOTE = " The final answer will be extracted from \\boxed{} inside the answer tags."

MATH_TEMPLATES = ("azr", "azr_boxed", "qwen-boxed")
CODE_TEMPLATES = ("evalplus", "azr")

EVALPLUS_INSTRUCTION = (
    "Please provide a self-contained Python script that solves the following problem in a markdown code block:"
)
EVALPLUS_RESPONSE = (
    "Below is a Python script with a self-contained function that solves the problem and passes corresponding tests:"
)


def wrap_r1(text: str, boxed: bool = False) -> str:
    return f"{R1_PREFIX}{BOXED_NOTE if boxed else ''} User: {text}\nAssistant: <think>"


def math_prompt(question: str, template: str) -> str:
    if template == "azr":
        return wrap_r1(question)
    if template == "azr_boxed":
        return wrap_r1(question, boxed=True)
    if template == "qwen-boxed":
        return (
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            f"<|im_start|>user\n{question}\nPlease reason step by step, and put your final answer "
            "within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
        )
    raise ValueError(f"unknown math template {template!r} (known: {', '.join(MATH_TEMPLATES)})")


def function_prompt(task_prompt: str, template: str) -> str:
    """HumanEval(+)/MBPP(+) prompt: a function signature/description to complete."""
    if template == "evalplus":
        return f"{EVALPLUS_INSTRUCTION}\n```\n{task_prompt.strip()}\n```\n\n{EVALPLUS_RESPONSE}\n```python\n"
    if template == "azr":
        return wrap_r1(
            f"{EVALPLUS_INSTRUCTION}\n```python\n{task_prompt.strip()}\n```\n"
            "Write the complete program in a ```python code block inside the answer tags."
        )
    raise ValueError(f"unknown code template {template!r} (known: {', '.join(CODE_TEMPLATES)})")


def lcb_prompt(question: str, starter_code: str, template: str) -> str:
    """LiveCodeBench generation prompt (AZR's LMStyle.AZR structure; evalplus = no R1 wrapper)."""
    task = (
        "You will be given a question (problem specification) and will generate a correct Python "
        "program that matches the specification and passes all tests. Put the program in a "
        "```python code block.\n\n"
        f"### Question:\n{question.strip()}\n\n"
    )
    if starter_code.strip():
        task += (
            "### Format: Use the following starter code to write the solution and enclose your "
            f"code within delimiters.\n```python\n{starter_code.rstrip()}\n```\n\n"
        )
    else:
        task += (
            "### Format: Read the inputs from stdin, solve the problem and write the answer to "
            "stdout (do not test directly on the sample inputs). Enclose your code within "
            "delimiters as follows.\n```python\n# YOUR CODE HERE\n```\n\n"
        )
    task += "### Answer: (use the provided format with backticks)\n"
    if template == "azr":
        return wrap_r1(task)
    if template == "evalplus":
        return task + "\n```python\n"
    raise ValueError(f"unknown code template {template!r} (known: {', '.join(CODE_TEMPLATES)})")


def stop_sequences(template: str, category: str) -> tuple[str, ...]:
    """Where generation may stop early: nothing after these strings is ever graded."""
    if template in ("azr", "azr_boxed"):
        return ("</answer>",)
    if template == "qwen-boxed":
        return ("<|im_end|>", "<|endoftext|>")
    if template == "evalplus" and category == "code":
        return ("\n```",)
    return ()


# --- extraction ------------------------------------------------------------------------------------

_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)


def answer_span(text: str) -> str | None:
    """Text of the last ``<answer>`` block (an unclosed final block counts: stop strings cut it)."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def extract_math(text: str, template: str) -> str:
    """The predicted final answer (AZR: inside <answer>; boxed content preferred; qwen-boxed: boxed)."""
    from .data.math_problems import last_boxed

    if template in ("azr", "azr_boxed"):
        span = answer_span(text)
        if span is None:
            return ""
        boxed = last_boxed(span)
        return (boxed if boxed is not None else span).strip()
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    m = re.findall(r"answer is[:\s]*\$?([^\n$]+)", text, flags=re.IGNORECASE)
    if m:
        return m[-1].strip().rstrip(".")
    nums = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    return nums[-1].replace(",", "") if nums else ""


_FENCE = re.compile(r"```[ \t]*(?:python|py|Python|python3)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


def extract_code(text: str, template: str) -> str:
    """The program in a completion: AZR reads <answer> then its code block; evalplus continues a fence."""
    if template == "azr":
        span = answer_span(text)
        if span is None:
            return ""
        blocks = _FENCE.findall(span)
        return (blocks[-1] if blocks else span).strip("\n")
    # evalplus: the prompt opened ```python, so the completion is code up to the closing fence;
    # a model that opens its own fence anyway gets its first block.
    if text.lstrip().startswith("```"):
        blocks = _FENCE.findall(text.lstrip())
        return blocks[0] if blocks else ""
    return text.split("```", 1)[0]
