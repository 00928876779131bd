"""A task need not be code: a third-party arithmetic package (tests/thirdparty_task), pip-installed and registered
through its entry point like any plugin, runs a nano step through the core as the recipe's only task; its own
payload (question, answer) is what the run records, and a problem file that does not fit its schema is a user
error naming the file, the line and the task. And the core reads no AZR field anywhere."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import REPO, install_a_copy, run_cli

PACKAGE = Path(__file__).parent.parent / "thirdparty_task"
AZR_FIELDS = {"program", "inputs", "outputs", "message"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    return install_a_copy(PACKAGE, tmp_path_factory.mktemp("thirdparty_task"))


def _recipe(tmp_path: Path, seeds: list[dict]) -> Path:
    """nano with the arithmetic task alone, one step, and seed questions so students solve from step 1."""
    recipe = yaml.safe_load((REPO / "recipes" / "nano.yaml").read_text())
    (tmp_path / "seeds.jsonl").write_text("".join(json.dumps(s) + "\n" for s in seeds))
    recipe.update(name="arithmetic", steps=1, tasks=[{"name": "arithmetic"}])
    recipe["probe"] = {"enabled": False}
    recipe["seeds"] = {"enabled": True, "file": str(tmp_path / "seeds.jsonl")}
    recipe["rollout"]["buffer_problems_per_student"] = 2
    path = tmp_path / "arithmetic.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _run(target: Path, recipe: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    pythonpath = os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return run_cli("run", str(recipe), "--run-dir", str(run_dir), env={"PYTHONPATH": pythonpath}, timeout=600)


SEEDS = [
    {"task_type": "arithmetic", "question": "What is 17 + 25?", "answer": "42", "valid": True},
    {"task_type": "arithmetic", "question": "What is 9 * 8?", "answer": "72", "valid": True},
]


@pytest.mark.slow
def test_a_nano_step_with_a_task_that_is_not_code(installed, tmp_path) -> None:
    res = _run(installed, _recipe(tmp_path, SEEDS), tmp_path / "run")
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "tasks" / "problems.jsonl").read_text().splitlines()]
    assert records and {r["task_type"] for r in records} == {"arithmetic"}
    for r in records:
        assert not AZR_FIELDS & r.keys()
        assert list(r)[3:6] == ["proposer_version", "question", "answer"]  # the task's payload, as it declares it
        if r["valid"]:
            assert r["answer"] and r["solve_rate"] is not None
        else:
            assert r["error"] and r["answer"] == ""  # nano's proposals are mostly not questions: invalid, recorded
    steps = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    (step,) = [e for e in steps if e.get("event") == "step"]
    assert "task/arithmetic/distinct_questions" in step and "task/arithmetic/validity" in step
    # the students answered the seed questions from the buffer: graded by the task, rewarded and trained on
    students = [k for k in step if k.startswith("member/s") and k.endswith("/solve_rate")]
    assert students and all(step[k] is not None for k in students)
    assert all(step[k.replace("solve_rate", "reward")] is not None for k in students)


@pytest.mark.slow
def test_a_problem_file_off_the_tasks_schema_names_file_line_and_task(installed, tmp_path) -> None:
    bad = [SEEDS[0], {"task_type": "arithmetic", "question": 17, "answer": "42"}]
    res = _run(installed, _recipe(tmp_path, bad), tmp_path / "run")
    assert res.returncode == 2, res.stderr
    assert "seeds.jsonl:2" in res.stderr and "'arithmetic'" in res.stderr and "question" in res.stderr
    assert "Traceback" not in res.stderr
    wrong = [{"task_type": "arithmetic", "question": "What is 2 + 2?", "answer": "5"}]
    res = _run(installed, _recipe(tmp_path, wrong), tmp_path / "run2")
    assert res.returncode == 2 and "seeds.jsonl:1" in res.stderr and "is not '4'" in res.stderr
    assert "Traceback" not in res.stderr


def test_the_core_reads_no_azr_field() -> None:
    """No attribute, key or string named like an AZR payload field in populora_core's code (docstrings and
    comments aside): the core asks the task for what it needs of a problem."""
    found = []
    for path in sorted((REPO / "populora_core").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in AZR_FIELDS:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in AZR_FIELDS and id(node) not in docstrings:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert not found, "the core reads AZR's payload fields:\n" + "\n".join(found)
