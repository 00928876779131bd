"""A third-party operator package (tests/thirdparty_operator) installed with pip and used like a built-in:
listed by ``populora plugins``, run by ``populora evolve``, and picked by a recipe's evolution mix."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from populora_lora_ops.synthetic import trained_like

from populora_core.services.adapters import load_lora, save_lora
from tests.cli_helpers import install_a_copy, run_cli

PACKAGE = Path(__file__).resolve().parents[2] / "thirdparty_operator"
TESTS = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    return install_a_copy(PACKAGE, tmp_path_factory.mktemp("thirdparty"))


def _run(target: Path, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    pythonpath = os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return run_cli(*args, env={"PYTHONPATH": pythonpath, **(extra_env or {})}, timeout=600)


def _scale_delta(target: Path, parent: Path, out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``populora evolve scale_delta`` with the third-party package at ``target`` on the path."""
    return _run(target, "evolve", "scale_delta", "--parent", str(parent), "--out", str(out), "--seed", "0", *options)


@pytest.mark.slow
def test_thirdparty_operator_is_listed_and_evolves(installed, tmp_path) -> None:
    res = _run(installed, "plugins", "--json")
    assert res.returncode == 0, res.stderr
    rows = {row["name"]: row for row in json.loads(res.stdout)}
    row = rows["example_operator"]
    assert row["error"] is None
    assert row["source"] == "populora-example-operator" and row["version"] == "0.1.0"
    assert "operator:scale_delta" in row["components"]
    assert row["operator_parents"] == {"scale_delta": {"min_parents": 1, "max_parents": 1, "text": "exactly 1"}}

    shapes = {f"base_model.model.model.layers.{i}.self_attn.q_proj": (16, 16) for i in range(2)}
    parent = trained_like(shapes, 4, 8.0, seed=1)
    save_lora(parent, tmp_path / "p")
    res = _scale_delta(installed, tmp_path / "p", tmp_path / "c", "--set", "factor=0.25")
    assert res.returncode == 0, res.stderr
    child = load_lora(tmp_path / "c")
    for name, f in parent.items():
        assert (child.modules[name].delta() - 0.25 * f.delta()).abs().max() < 1e-7
    record = json.loads((tmp_path / "c" / "lineage.json").read_text())
    assert record["operator"] == "scale_delta" and record["plugin"] == "example_operator"
    assert record["params"] == {"factor": 0.25, "jitter": 0.0}

    res = _scale_delta(installed, tmp_path / "p", tmp_path / "d", "--set", "factor=-1")
    assert res.returncode == 2 and "factor" in res.stderr and "Traceback" not in res.stderr

    res = _scale_delta(installed.parent / "not-installed", tmp_path / "p", tmp_path / "e")
    assert res.returncode == 2 and "unknown operator 'scale_delta'" in res.stderr


@pytest.mark.slow
def test_recipe_uses_thirdparty_operator(installed, tiny_model_dir, tmp_path) -> None:
    """The core loop's fake stack runs a recipe whose evolution mix is only the third-party operator."""
    res = _run(
        installed,
        "--plugin",
        str(TESTS / "fake_stack.py"),
        "run",
        str(TESTS / "recipes" / "fake_2t2s.yaml"),
        "evolution.operators=[{name: scale_delta, weight: 1.0, params: {factor: 0.5}}]",
        "--run-dir",
        str(tmp_path / "run"),
        extra_env={"POPULORA_TEST_MODEL": str(tiny_model_dir)},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    events = [json.loads(line) for line in (tmp_path / "run" / "lineage.jsonl").read_text().splitlines()]
    children = [e for e in events if e["operator"] != "init"]
    assert children and all(e["operator"] == "scale_delta" for e in children)
    assert all(e["params"]["factor"] == 0.5 for e in children)


@pytest.mark.slow
def test_a_run_records_each_components_package_and_a_resume_without_it_names_the_plugin(
    installed, tiny_model_dir, tmp_path
) -> None:
    """RUN/components.json and run.log name the plugin, package and version of every component; resuming after
    the operator's package was uninstalled is an exit-2 error naming that package, not only the unknown name."""
    run_dir = tmp_path / "run"
    env = {"POPULORA_TEST_MODEL": str(tiny_model_dir)}
    fake = ("--plugin", str(TESTS / "fake_stack.py"))
    mix = "evolution.operators=[{name: scale_delta, weight: 1.0, params: {factor: 0.5}}]"
    recipe = str(TESTS / "recipes" / "fake_2t2s.yaml")
    res = _run(installed, *fake, "run", recipe, "steps=2", mix, "--run-dir", str(run_dir), extra_env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {row["path"]: row for row in json.loads((run_dir / "components.json").read_text())}
    assert rows["evolution.operators.0"] == {
        "path": "evolution.operators.0",
        "kind": "operator",
        "name": "scale_delta",
        "plugin": "example_operator",
        "package": "populora-example-operator",
        "version": "0.1.0",
    }
    assert rows["matchmaker"]["package"] == "populora-toolkit" and rows["engine"]["plugin"] == "file:fake_stack"
    log = (run_dir / "run.log").read_text()
    assert "operator scale_delta (example_operator: populora-example-operator 0.1.0)" in log
    assert "matchmaker pfsp (matchmaking: populora-toolkit " in log

    gone = installed.parent / "not-installed"  # the package uninstalled: not on the path any more
    res = _run(gone, *fake, "resume", str(run_dir), "steps=4", extra_env=env)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "unknown operator 'scale_delta'" in res.stderr
    assert "came from plugin example_operator (package populora-example-operator 0.1.0)" in res.stderr
    assert "reinstall it to resume" in res.stderr
