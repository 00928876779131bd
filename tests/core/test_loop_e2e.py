"""End to end on the real stack (sandbox, AZR tasks, hf engine, trr++, PFSP, LoRA operators), tiny model."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli_helpers import POPULORA, REPO, invoke_cli, kill_inside_step

pytestmark = pytest.mark.slow
RECIPE = str(Path(__file__).resolve().parents[1] / "recipes" / "tiny_real_2t2s.yaml")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from benchmarks.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("e2e_model"))
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MODEL": str(model)}


def _populora(env, *args):
    """``populora ARGS`` in this process (the runs and resumes whose results, not processes, the tests compare)."""
    result = invoke_cli(*args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def reference_run(env, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("e2e") / "reference"
    _populora(env, "run", RECIPE, f"base_model={env['MODEL']}", "steps=3", "--run-dir", str(run_dir), "--no-progress")
    return run_dir


def test_population_run_logs_matches_rewards_updates_and_a_child(reference_run):
    events = [json.loads(x) for x in (reference_run / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["event"] == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert len(s["matches"]) == 2 and all(t.startswith("t") and st.startswith("s") for t, st in s["matches"])
        assert s["member/t0/reward"] is not None or s["step"] > 2
    # every surviving original member was updated and its adapter moved
    first = steps[0]
    for member in ("t0", "t1", "s0", "s1"):
        assert first[f"member/{member}/counters/updates"] == 1
        v0, v1 = (_tensors(reference_run / "adapters" / f"{member}@v{k}") for k in (0, 1))
        assert any(not (v0[k] == v1[k]).all() for k in v0), f"{member}'s update did not change its adapter"
    children = [e for e in events if e["event"] == "evolution"]
    assert len(children) == 2 and {c["role"] for c in children} == {"teacher", "student"}
    for child in children:
        assert child["rank"] == 4 and child["operator"] in ("svd", "svd_structured")
        weights = _tensors(reference_run / "adapters" / child["child"])
        assert all(t.shape[0] == 4 for k, t in weights.items() if "lora_A" in k)
    problems = (reference_run / "tasks" / "problems.jsonl").read_text().splitlines()
    assert len(problems) == 3 * 2 * 3 * 2  # steps x teachers x task types x proposals


def test_single_agent_baseline_recipe_runs_through_the_same_loop(env, tmp_path):
    run_dir = tmp_path / "baseline"
    _populora(
        env,
        "run",
        RECIPE,
        f"base_model={env['MODEL']}",
        "steps=1",
        "population.mode=single_agent",
        "population.teachers=1",
        "population.students=1",
        "--run-dir",
        str(run_dir),
        "--no-progress",
    )
    (step,) = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if '"step"' in x][:1]
    assert step["matches"] == [["a0", "a0"]]
    assert step["member/a0/counters/updates"] == 1 and step["member/a0/counters/rollouts"] > 0


def test_sigkill_mid_step_then_resume_matches_the_uninterrupted_run(env, reference_run, tmp_path):
    run_dir = tmp_path / "killed"
    args = ["run", RECIPE, f"base_model={env['MODEL']}", "steps=3", "--run-dir", str(run_dir), "--no-progress"]
    kill_inside_step(args, env, 3, tmp_path / "paused")  # inside step 3: matched, nothing generated or trained yet
    assert (run_dir / "checkpoints" / "LATEST").read_text().strip() == "00000002"
    _populora(env, "resume", str(run_dir), "--no-progress")
    ref = sorted(p.name for p in (reference_run / "adapters").iterdir())
    assert sorted(p.name for p in (run_dir / "adapters").iterdir()) == ref
    for name in ref:
        a, b = _tensors(reference_run / "adapters" / name), _tensors(run_dir / "adapters" / name)
        assert a.keys() == b.keys()
        for key in a:
            assert (a[key] == b[key]).all(), f"{name}:{key} differs after resume"
    for log in ("lineage.jsonl", "tasks/problems.jsonl"):
        assert (run_dir / log).read_text() == (reference_run / log).read_text()
    assert json.loads((run_dir / "members.json").read_text()) == json.loads(
        (reference_run / "members.json").read_text()
    )


class _Payload:
    """Unpickling this runs ``touch MARKER``: what a hostile checkpoint would do with os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_tensor_file_with_a_pickled_payload_is_refused_and_the_run_is_not_lost(env, reference_run, tmp_path):
    """Issue 51 on the real stack: a member's optimizer file in the newest checkpoint replaced by a torch file whose
    pickle runs code, the manifest rewritten to match. The resume is refused (exit 2) with nothing run or changed;
    with that checkpoint moved out, as the message says, the run resumes from the one before to the adapters of
    the uninterrupted run."""
    import torch

    from tests.core.test_checkpoint_data import _unchanged, plant

    run_dir = tmp_path / "planted"
    shutil.copytree(reference_run, run_dir)
    last = run_dir / "checkpoints" / "00000003"
    member = sorted((last / "trainer" / "members").iterdir())[0]
    state = torch.load(member, weights_only=True)
    marker = tmp_path / "PWNED"
    buffer = io.BytesIO()
    torch.save({**state, "extra": {"payload": _Payload(marker)}}, buffer)
    plant(last, str(member.relative_to(last)), buffer.getvalue())
    before = _unchanged(run_dir)
    args = [POPULORA, "resume", str(run_dir), "steps=4", "--no-progress"]
    refused = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "holds more than tensors and plain data, refused unread" in refused.stderr
    assert f"move {last} out of {last.parent}" in refused.stderr
    assert not marker.exists(), "resume unpickled the planted payload"
    assert _unchanged(run_dir) == before
    shutil.move(last, tmp_path / "set-aside")
    _populora(env, "resume", str(run_dir), "--no-progress")
    assert not marker.exists()
    for name in sorted(p.name for p in (reference_run / "adapters").iterdir()):
        a, b = _tensors(reference_run / "adapters" / name), _tensors(run_dir / "adapters" / name)
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a), f"{name} differs after resume"
    assert (run_dir / "lineage.jsonl").read_text() == (reference_run / "lineage.jsonl").read_text()
