"""Small hand-written benchmark files in the exact local formats the evaluators accept (EvalPlus jsonl,
LiveCodeBench code_generation_lite jsonl, a local math jsonl), written into a temp dir by tests."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path

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


class OracleEngine:
    """Answers math prompts from the shipped gold: adapters named ``*good*`` right, others wrong.

    The base model (no adapter) answers the first half of the problems right, so every subject has a
    different, predictable score.
    """

    def __init__(self) -> None:
        from populora_evals.evaluators import BENCHMARKS

        self.gold: list[tuple[str, str, int]] = []
        for name in ("aime24", "gsm8k"):
            for i, item in enumerate(BENCHMARKS[name]().items(10)):
                self.gold.append((item["question"], item["answer"], i))

    def generate(self, requests, sampling):
        from populora_core.components import Completion

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

    def close(self) -> None:
        pass


def make_oracle_engine(params, *, base_model, lora, seed):
    return OracleEngine()


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


def make_adapter(path: Path, base_dir: Path | None, seed: int) -> Path:
    import torch

    if base_dir is None:
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        g = torch.Generator().manual_seed(seed)
        save_file(
            {
                "base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(4, 8, generator=g),
                "base_model.model.layers.0.q_proj.lora_B.weight": torch.randn(8, 4, generator=g),
            },
            str(path / "adapter_model.safetensors"),
        )
        (path / "adapter_config.json").write_text(
            json.dumps(
                {
                    "peft_type": "LORA",
                    "r": 4,
                    "lora_alpha": 8,
                    "target_modules": ["q_proj"],
                    "base_model_name_or_path": "unused",
                }
            )
        )
        return path
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.5)
    peft_model.save_pretrained(str(path))
    return path


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
