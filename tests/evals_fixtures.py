"""Small hand-written benchmark files in the exact local formats the evaluators accept (EvalPlus jsonl,
LiveCodeBench code_generation_lite jsonl, a local math jsonl), written into a temp dir by tests."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path

import pytest

from benchmarks.tiny_model import make_adapter
from populora_core.api.components import RolloutEngine

EVALPLUS_ROWS = [
    {
        "task_id": "HumanEval/0",
        "entry_point": "add_up",
        "prompt": (
            'def add_up(xs: list) -> int:\n    """Sum of the integers in xs.\n    >>> add_up([1, 2])\n    3\n    """\n'
        ),
        "canonical_solution": "    total = 0\n    for x in xs:\n        total += x\n    return total\n",
        "base_input": [[[1, 2]], [[5]]],
        "plus_input": [[[]], [[-3, 3, 10]], [list(range(100))]],
        "atol": 0,
    },
    {
        "task_id": "HumanEval/1",
        "entry_point": "mean",
        "prompt": 'def mean(xs: list) -> float:\n    """Arithmetic mean.\n    >>> mean([1.0, 2.0])\n    1.5\n    """\n',
        "canonical_solution": "    return sum(xs) / len(xs)\n",
        "base_input": [[[1.0, 2.0]], [[0.1, 0.2, 0.3]]],
        "plus_input": [[[1e-9, 3.0]], [[2.5]]],
        "atol": 0,
    },
]

#: A completion that passes the base tests of add_up but not the plus tests (empty list).
ADD_UP_BASE_ONLY = "def add_up(xs):\n    return xs[0] + sum(xs[1:])\n"


def write_evalplus(directory: Path) -> Path:
    path = directory / "HumanEvalPlus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in EVALPLUS_ROWS))
    return path


def _compress(tests: list[dict]) -> str:
    """LiveCodeBench's private-test encoding: base64(zlib(pickle(json string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


LCB_ROWS = [
    {
        "question_title": "Sum",
        "question_id": "abc001_a",
        "contest_id": "abc001",
        "platform": "atcoder",
        "contest_date": "2024-01-06T00:00:00",
        "difficulty": "easy",
        "question_content": "Read two integers A and B and print A+B.",
        "starter_code": "",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": _compress(
            [
                {"input": "10 -4\n", "output": "6\n", "testtype": "stdin"},
                {"input": "0 0\n", "output": "0\n", "testtype": "stdin"},
            ]
        ),
        "metadata": "{}",
    },
    {
        "question_title": "Two Sum",
        "question_id": "1",
        "contest_id": "weekly-1",
        "platform": "leetcode",
        "contest_date": "2024-02-01T00:00:00",
        "difficulty": "easy",
        "question_content": "Return indices of the two numbers that add up to target.",
        "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
        "public_test_cases": json.dumps([{"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "testtype": "functional"}]),
        "private_test_cases": _compress([{"input": "[3, 2, 4]\n6", "output": "[1, 2]", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "twoSum"}),
    },
]

LCB_SOLUTIONS = {
    "lcb/abc001_a": "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
    "lcb/1": (
        "```python\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return [seen[target - x], i]\n            seen[x] = i\n```"
    ),
}
LCB_WRONG = {
    "lcb/abc001_a": "```python\na, b = map(int, input().split())\nprint(a - b)\n```",
    "lcb/1": "```python\nclass Solution:\n    def twoSum(self, nums, target):\n        return (0, 1)\n```",
}
LCB_OPEN0 = "```python\nimport sys\na, b = map(int, open(0).read().split())\nsys.stdout.write(str(a + b) + '\\n')\n```"


def write_lcb(directory: Path) -> Path:
    path = directory / "test6.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in LCB_ROWS))
    return path


MATH_ROWS = [
    {"id": 0, "question": "What is $1+1$?", "answer": "2"},
    {"id": 1, "problem": "Simplify $\\frac{2}{4}$.", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
    {"id": 2, "question": "Roots of $x^2=4$?", "final_answer": ["\\pm 2"]},
]


def write_math(directory: Path, name: str = "amc23.jsonl") -> Path:
    path = directory / name
    path.write_text("".join(json.dumps(r) + "\n" for r in MATH_ROWS))
    return path


# --- a scripted engine for CLI plumbing tests (loaded by the registry as "module:attr") -------------

CALLS: list[int] = []  # number of requests of each generate() call
REQUESTS: list[tuple[str | None, str, tuple[str, ...]]] = []  # (adapter name, prompt, stop strings)


class OracleEngine(RolloutEngine):
    """Answers math prompts from the shipped gold: adapters named ``*good*`` right, others wrong.

    The base model (no adapter) answers the first half of the problems right, so every subject has a
    different, predictable score. ``benchmarks`` names whose gold it knows (first 30 problems each).
    """

    benchmarks: tuple[str, ...] = ("aime24", "gsm8k")

    def __init__(self) -> None:
        from populora_evals.evaluators import BENCHMARKS

        self.gold: list[tuple[str, str, int]] = []
        for name in self.benchmarks:
            for i, item in enumerate(BENCHMARKS[name]().items(30)):
                self.gold.append((item["question"], item["answer"], i))

    def generate(self, requests, sampling):
        from populora_core.api.components import Completion

        CALLS.append(len(requests))
        REQUESTS.extend((r.adapter.name if r.adapter else None, r.prompt, sampling.stop) for r in requests)
        out = []
        for req in requests:
            answer, index = next((a, i) for q, a, i in self.gold if q in req.prompt)
            if req.adapter is None:
                right = index < 5
            else:
                right = "good" in req.adapter.name
            text = f" reasoning </think> <answer>\\boxed{{{answer if right else answer + '1'}}}</answer>"
            out.append(
                [Completion(text=text, token_ids=[1, 2, 3], logprobs=[0.0] * 3, prompt_token_ids=[0])] * sampling.n
            )
        return out

    def sleep(self) -> None:
        pass


def make_oracle_engine(params, *, base_model, lora, seed):
    return OracleEngine()


class SplitEngine(OracleEngine):
    """Like :class:`OracleEngine` for the base; an adapter named ``*gsm*`` is right on every gsm8k problem and no
    aime24 one, ``*aime*`` on the first 2 aime24 problems and no gsm8k one: AVG (aime24 alone: AZR's averages
    leave GSM8K out) and the mean over both benchmarks rank them in opposite orders."""

    def generate(self, requests, sampling):
        from populora_evals.evaluators import BENCHMARKS

        from populora_core.api.components import Completion

        gsm = {item["question"] for item in BENCHMARKS["gsm8k"]().items(30)}
        CALLS.append(len(requests))
        out = []
        for req in requests:
            question, answer, index = next((q, a, i) for q, a, i in self.gold if q in req.prompt)
            name = req.adapter.name if req.adapter else ""
            if req.adapter is None:
                right = index < 5
            elif "gsm" in name:
                right = question in gsm
            else:
                right = question not in gsm and index < 2
            text = f" reasoning </think> <answer>\\boxed{{{answer if right else answer + '1'}}}</answer>"
            out.append(
                [Completion(text=text, token_ids=[1, 2, 3], logprobs=[0.0] * 3, prompt_token_ids=[0])] * sampling.n
            )
        return out


def make_split_engine(params, *, base_model, lora, seed):
    return SplitEngine()


def write_run(
    run_dir: Path, base_model: str, members: list[tuple[str, str, int]], *, base_dir: Path | None = None, seed: int = 0
) -> Path:
    """A run directory as the loop writes it: recipe.yaml, members.json, adapters/<id>@v<k>/.

    Adapters are real PEFT LoRA dirs on ``base_dir`` (a tiny model) with random non-zero B, or tiny
    hand-made safetensors when no model is given (enough for hashing and resolution).
    """
    import json as _json

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "recipe.yaml").write_text(f"name: test\nbase_model: {base_model}\n")
    (run_dir / "members.json").write_text(
        _json.dumps([{"id": m, "role": role, "version": v} for m, role, v in members])
    )
    for k, (m, _role, v) in enumerate(members):
        make_adapter(run_dir / "adapters" / f"{m}@v{v}", base_dir, seed=seed + k)
    return run_dir


MBPP_PLUS_ROWS = [
    {
        "task_id": "Mbpp/2",
        "entry_point": "similar_elements",
        "prompt": '"""\nWrite a function to find the shared elements from the given two lists.\n'
        'assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n"""\n',
        "canonical_solution": "def similar_elements(test_tup1, test_tup2):\n"
        "  return tuple(sorted(set(test_tup1) & set(test_tup2)))\n",
        "base_input": [[[3, 4, 5, 6], [5, 7, 4, 10]], [[1, 2, 3, 4], [5, 4, 3, 7]]],
        "plus_input": [[[], [1]], [[1, 1, 2], [2, 2]]],
        "atol": 0,
    },
]


def write_mbpp_plus(directory: Path) -> Path:
    path = directory / "MbppPlus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MBPP_PLUS_ROWS))
    return path


# --- hub datasets: a Hugging Face cache laid out as huggingface_hub lays it ---------------------------
# Rows are written by hand in each dataset's real columns (never the real data). A snapshot file is a
# relative symlink to blobs/<sha256>, refs/<branch> holds the commit, as the hub client writes them.


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache (HF_HUB_CACHE), offline; tests fill it with :func:`populate_hub`."""
    from huggingface_hub import constants

    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def write_hub_cache(cache: Path, repo_id: str, commit: str, files: dict[str, bytes], ref: str | None = None) -> Path:
    """One dataset snapshot in ``cache`` (HF_HUB_CACHE); ``ref`` (e.g. "main") also points at it."""
    import hashlib
    import os

    repo = cache / ("datasets--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for rel, blob in files.items():
        digest = hashlib.sha256(blob).hexdigest()
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        (repo / "blobs" / digest).write_bytes(blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / digest, link.parent))
    if ref:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def parquet(rows: list[dict]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


HE_TEST = """
import numpy as np

def is_floats(x) -> bool:
    return isinstance(x, float)

def assertion(out, exp, atol):
    assert out == exp

def check(candidate):
    inputs = [[[1, 2]], [[5]], [[]], [[-3, 3, 10]]]
    results = [3, 5, 0, 10]
    for i, (inp, exp) in enumerate(zip(inputs, results)):
        assertion(candidate(*inp), exp, 0)
"""

MBPP_PLUS_TEST = """
import numpy as np
from math import inf

def assertion(out, exp, atol):
    assert out == exp

inputs = [[(3, 4, 5, 6), (5, 7, 4, 10)], [(1, 2, 3, 4), (5, 4, 3, 7)], [(), (1,)], [(inf, 1), (inf,)]]
results = [(4, 5), (3, 4), (), (inf,)]
for i, (inp, exp) in enumerate(zip(inputs, results)):
    assertion(similar_elements(*inp), exp, 0)
"""


def aime25_rows(n: int = 30) -> list[dict]:
    """math-ai/aime25's columns (problem, answer, id), AIME I then II; made-up problems."""
    return [
        {
            "problem": f"Compute ${k} + {k}$.",
            "answer": str(2 * k),
            "id": f"{'I' if k <= 15 else 'II'}-{(k - 1) % 15 + 1}",
        }
        for k in range(1, n + 1)
    ]


#: benchmark -> (hub id, file in the repo, its bytes, (first item id, its gold answer or entry point))
def hub_datasets() -> dict[str, tuple[str, str, bytes, tuple[str, str]]]:
    lcb = [{**row, "contest_date": date} for row, date in zip(LCB_ROWS, ("2023-06-01T00:00:00", "2024-11-01T00:00:00"))]
    return {
        "humaneval": (
            "openai/openai_humaneval",
            "openai_humaneval/test-00000-of-00001.parquet",
            parquet(
                [
                    {
                        "task_id": "HumanEval/0",
                        "prompt": EVALPLUS_ROWS[0]["prompt"],
                        "canonical_solution": EVALPLUS_ROWS[0]["canonical_solution"],
                        "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n",
                        "entry_point": "add_up",
                    }
                ]
            ),
            ("HumanEval/0", "add_up"),
        ),
        "mbpp": (
            "google-research-datasets/mbpp",
            "full/test-00000-of-00001.parquet",
            parquet(
                [
                    {
                        "task_id": 11,
                        "text": "Write a python function to add two numbers.",
                        "code": "def add(a, b):\n    return a + b",
                        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
                        "test_setup_code": "",
                        "challenge_test_list": [],
                    }
                ]
            ),
            ("Mbpp/11", "Write a python function to add two numbers."),
        ),
        "gsm8k": (
            "openai/gsm8k",
            "main/test-00000-of-00001.parquet",
            parquet(
                [
                    {
                        "question": "Ann has 1,200 apples and eats 2. How many are left?",
                        "answer": "1200 - 2 = 1198\n#### 1,198",
                    }
                ]
            ),
            ("gsm8k/0", "1198"),
        ),
        "math500": (
            "HuggingFaceH4/MATH-500",
            "test.jsonl",
            jsonl(
                [
                    {
                        "problem": "Simplify $\\frac{2}{4}$.",
                        "solution": "Divide: $\\boxed{\\frac{1}{2}}$.",
                        "answer": "1/2",
                        "subject": "Prealgebra",
                        "level": 1,
                        "unique_id": "test/prealgebra/1.json",
                    }
                ]
            ),
            ("math500/test/prealgebra/1.json", "\\frac{1}{2}"),
        ),
        "aime24": (
            "HuggingFaceH4/aime_2024",
            "data/train-00000-of-00001.parquet",
            parquet(
                [
                    {
                        "id": 60,
                        "problem": "Compute $6 \\cdot 7$.",
                        "solution": "It is $42$.",
                        "answer": "42",
                        "url": "https://example.invalid/aime",
                        "year": "2024",
                    }
                ]
            ),
            ("aime24/60", "42"),
        ),
        "aime25": ("math-ai/aime25", "test.jsonl", jsonl(aime25_rows()), ("aime25/I-1", "2")),
        "amc23": (
            "math-ai/amc23",
            "test-00000-of-00001.parquet",
            parquet([{"id": 0, "question": "What is $20 + 7$?", "answer": 27.0, "url": "https://example.invalid/amc"}]),
            ("amc23/0", "27"),
        ),
        "minerva": (
            "math-ai/minervamath",
            "test.jsonl",
            jsonl([{"question": "A mass of 2 kg at 3 m/s: its momentum in kg m/s?", "answer": "6"}]),
            ("minerva/0", "6"),
        ),
        "olympiadbench": (
            "Hothan/OlympiadBench",
            "OlympiadBench/OE_TO_maths_en_COMP/OE_TO_maths_en_COMP.parquet",
            parquet(
                [
                    {
                        "id": 1606,
                        "question": "Find the smallest positive $n$ with $n^2 > 10$.",
                        "solution": ["Since $3^2 = 9$ and $4^2 = 16$, it is $4$."],
                        "final_answer": ["$4$"],
                        "context": None,
                        "image_1": None,
                        "modality": "Text-only",
                        "difficulty": "Competition",
                        "is_multiple_answer": False,
                        "unit": None,
                        "answer_type": "Numerical",
                        "error": None,
                        "question_type": "Open-ended",
                        "subfield": "Number Theory",
                        "subject": "Math",
                        "language": "English",
                    }
                ]
            ),
            ("olympiadbench/1606", "4"),
        ),
        "humaneval_plus": (
            "evalplus/humanevalplus",
            "test.jsonl",
            jsonl(
                [
                    {
                        "task_id": "HumanEval/0",
                        "prompt": EVALPLUS_ROWS[0]["prompt"],
                        "canonical_solution": EVALPLUS_ROWS[0]["canonical_solution"],
                        "entry_point": "add_up",
                        "test": HE_TEST,
                    }
                ]
            ),
            ("HumanEval/0", "add_up"),
        ),
        "mbpp_plus": (
            "evalplus/mbppplus",
            "data/test-00000-of-00001-d5781c9c51e02795.parquet",
            parquet(
                [
                    {
                        "task_id": 2,
                        "code": MBPP_PLUS_ROWS[0]["canonical_solution"],
                        "prompt": "Write a function to find the shared elements from the given two lists.",
                        "source_file": "Benchmark Questions Verification V2.ipynb",
                        "test_imports": ["from math import inf"],
                        "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))"],
                        "test": MBPP_PLUS_TEST,
                    }
                ]
            ),
            ("Mbpp/2", "similar_elements"),
        ),
        "livecodebench": (
            "livecodebench/code_generation_lite",
            "test.jsonl",
            jsonl(lcb[:1]),
            ("lcb/abc001_a", "Read two integers A and B and print A+B."),
        ),
    }


def hub_commit(name: str) -> tuple[str, str | None]:
    """The commit a fixture snapshot lives at, and the branch that points to it (unpinned datasets)."""
    from populora_evals.evaluators import BENCHMARKS

    revision = BENCHMARKS[name].hub.revision
    if len(revision) == 40:
        return revision, None
    return "0123456789abcdef0123456789abcdef01234567", revision


def populate_hub(cache: Path, names: list[str] | None = None) -> dict[str, Path]:
    """Write the fixture snapshot of each benchmark (default: all) into ``cache``; snapshot dirs."""
    out = {}
    for name, (repo, rel, blob, _) in hub_datasets().items():
        if names is not None and name not in names:
            continue
        commit, ref = hub_commit(name)
        files = {rel: blob}
        if name == "livecodebench":  # release_v5 is test.jsonl .. test5.jsonl; test6 must stay unread
            lcb = [{**r, "contest_date": "2024-11-01T00:00:00"} for r in LCB_ROWS[1:]]
            files["test5.jsonl"] = jsonl(lcb)
            files["test6.jsonl"] = jsonl([{**LCB_ROWS[0], "question_id": "v6_only"}])
        out[name] = write_hub_cache(cache, repo, commit, files, ref)
    return out


# --- records of the real data that once stopped a benchmark or were graded wrong ----------------------
# Hand-written in the shape of each kind (never the real data): complex-number inputs, a 4-argument
# assertion, re.Match outputs, set outputs, tuple inputs, a 5,000-digit literal, a RecursionError.


def _hub_test(
    inputs: str, call: str, assertion: str = "def assertion(out, exp, atol):\n    assert out == exp\n"
) -> str:
    """An EvalPlus hub test program: imports, an assertion helper, inputs, results never read by us."""
    return (
        f"import numpy as np\nfrom math import inf\n\n{assertion}\ninputs = {inputs}\nresults = [None] * len(inputs)\n"
        f"for i, (inp, exp) in enumerate(zip(inputs, results)):\n    {call}\n"
    )


def _mbpp_hub_row(task_id: int, prompt: str, code: str, test: str) -> dict:
    return {
        "task_id": task_id,
        "code": code,
        "prompt": prompt,
        "source_file": "hand-written fixture",
        "test_imports": [],
        "test_list": [f"assert {prompt.split()[0].lower()} is not None"],
        "test": test,
    }


BIG = (10**5000 - 1) // 9 * 7  # 77...7, 5,000 digits: a literal ast.parse refuses under the 4,300-digit limit

MBPP_PLUS_HUB_RECORDS = {
    "complex": _mbpp_hub_row(
        124,
        "Angle of a complex number given as a real part and an imaginary part.",
        "import cmath\ndef angle_complex(a, b):\n    return cmath.phase(a + b)\n",
        _hub_test("[(0.0, 1j), (2.0, 1j), (0.0, 2j), (-1.0, -0.5j)]", "assertion(angle_complex(*inp), exp, 0.0001)"),
    ),
    "four_args": _mbpp_hub_row(
        581,
        "Surface area of a square pyramid from its base edge and height.",
        "def surface_Area(b, s):\n    return 2 * b * s + pow(b, 2)\n",
        _hub_test(
            "[[3, 4], [4, 5], [1, 2]]",
            "assertion(surface_Area(*inp), exp, _surface_Area(*inp), 0.0001)",
            "def _surface_Area(b, h):\n    return 0\n\ndef assertion(out, exp_0, exp_1, atol):\n"
            "    assert abs(out - exp_0) <= atol or abs(out - exp_1) <= atol\n",
        ),
    ),
    "re_match": _mbpp_hub_row(
        737,
        "Whether a string starts with a vowel, with a regex.",
        "import re\ndef check_str(string):\n    return re.search(r'^[aeiouAEIOU][A-Za-z0-9_]*', string)\n",
        _hub_test("[['annie'], ['dawood'], ['Else']]", "assertion(check_str(*inp), exp, 0)"),
    ),
    "set_output": _mbpp_hub_row(
        579,
        "The elements of two tuples that are not in both.",
        "def find_dissimilar(a, b):\n"
        "    assert isinstance(a, tuple) and isinstance(b, tuple), 'invalid inputs'  # $_CONTRACT_$\n"
        "    return tuple(set(a) ^ set(b))\n",
        _hub_test(
            "[((3, 4, 5, 6), (5, 7, 4, 10)), ((1, 2, 3, 4), (7, 2, 3, 9))]", "assertion(find_dissimilar(*inp), exp, 0)"
        ),
    ),
    "big_literal": _mbpp_hub_row(
        435,
        "The last digit of a number.",
        "def last_Digit(n):\n    return n % 10\n",
        _hub_test("[[" + "7" * 5000 + "], [12]]", "assertion(last_Digit(*inp), exp, 0)"),
    ),
    "recursion": _mbpp_hub_row(
        901,
        "A record whose inputs nest too deep to be read.",
        "def negate(x):\n    return -x\n",
        _hub_test("[[" + "-" * 5000 + "1]]", "assertion(negate(*inp), exp, 0)"),
    ),
}

#: Completions per record kind: (right ones EvalPlus accepts, wrong ones).
MBPP_PLUS_HUB_COMPLETIONS = {
    "complex": (
        ["import cmath\ndef angle_complex(a, b):\n    return cmath.phase(complex(a.real, b.imag))\n"],
        ["def angle_complex(a, b):\n    return 0.0\n"],
    ),
    "four_args": (
        ["import math\ndef surface_Area(b, h):\n    return round(b * b + 2 * b * math.sqrt((b / 2) ** 2 + h * h))\n"],
        ["def surface_Area(b, s):\n    return b * s\n"],
    ),
    "re_match": (
        ["def check_str(string):\n    return string[:1].lower() in 'aeiou'\n"],
        ["import re\ndef check_str(string):\n    return re.search('.', string)\n"],
    ),
    "set_output": (
        ["def find_dissimilar(a, b):\n    return tuple(sorted(set(a) ^ set(b), reverse=True))\n"],
        ["def find_dissimilar(a, b):\n    return tuple(set(a) | set(b))\n"],
    ),
    "big_literal": (
        ["def last_Digit(n):\n    return n - n // 10 * 10\n"],
        ["def last_Digit(n):\n    return n % 100\n"],
    ),
}


def write_mbpp_plus_hub(directory: Path, kinds: list[str] | None = None) -> Path:
    """evalplus/mbppplus's parquet layout holding the record kinds named (default: all)."""
    rows = [r for k, r in MBPP_PLUS_HUB_RECORDS.items() if kinds is None or k in kinds]
    path = directory / "test-00000-of-00001.parquet"
    path.write_bytes(parquet(rows))
    return path


#: MbppPlus.jsonl release records (JSON: tuples arrive as lists, complex numbers as strings).
MBPP_PLUS_RELEASE_RECORDS = [
    {
        "task_id": "Mbpp/793",
        "prompt": '"""\nThe last position of an element in a sorted array.\nassert last([1,2,3],1) == 0\n"""\n',
        "entry_point": "last",
        "canonical_solution": "def last(arr, x):\n    return len(arr) - 1 - arr[::-1].index(x)\n",
        "base_input": [[[1, 2, 3], 1], [[1, 1, 1, 2, 3, 4], 1]],
        "plus_input": {},
        "atol": 0,
    },
    {
        "task_id": "Mbpp/124",
        "prompt": '"""\nAngle of a complex number.\nassert angle_complex(0,1j) > 1.57\n"""\n',
        "entry_point": "angle_complex",
        "canonical_solution": "import cmath\ndef angle_complex(a, b):\n    return cmath.phase(a + b)\n",
        "base_input": [["0", "1j"], ["2", "1j"]],
        "plus_input": [["-1", "(-0-2j)"], ["1e-100", "1e-100j"]],
        "atol": 0.0001,
    },
    {
        "task_id": "Mbpp/252",
        "prompt": '"""\nComplex number to polar coordinates.\nassert convert(1) == (1.0, 0.0)\n"""\n',
        "entry_point": "convert",
        "canonical_solution": "import cmath\ndef convert(z):\n    return cmath.polar(z)\n",
        "base_input": [[1], [4]],
        "plus_input": [["(1+2j)"], ["(-3+4j)"]],
        "atol": 0,
    },
    {
        "task_id": "Mbpp/2",
        "prompt": '"""\nShared elements of two tuples.\nassert similar_elements((3, 4), (4, 5)) == (4,)\n"""\n',
        "entry_point": "similar_elements",
        "canonical_solution": "def similar_elements(a, b):\n"
        "    assert isinstance(a, tuple) and isinstance(b, tuple), 'invalid inputs'  # $_CONTRACT_$\n"
        "    return tuple(set(a) & set(b))\n",
        "base_input": [[[3, 4, 5, 6], [5, 7, 4, 10]]],
        "plus_input": [[[1, 2, 3, 4], [5, 4, 3, 7]]],
        "atol": 0,
    },
]


def write_mbpp_plus_release(directory: Path) -> Path:
    path = directory / "MbppPlus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MBPP_PLUS_RELEASE_RECORDS))
    return path


#: Hothan/OlympiadBench rows: two answers written `$a$,$b$` (21 of 675 in the real data), a unit.
OLYMPIAD_ROWS = [
    {"id": 2001, "question": "Find both ages.", "final_answer": ["$69$,$84$"], "unit": None},
    {"id": 2002, "question": "How long is the side?", "final_answer": ["$12\\text{ cm}$"], "unit": "cm"},
    {"id": 2003, "question": "Which angle?", "final_answer": ["$90^{\\circ}$"], "unit": None},
]
