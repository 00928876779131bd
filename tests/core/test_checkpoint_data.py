"""A checkpoint is data: resuming a run directory never runs code from it (issue 51).

Task state is ``tasks/<name>.json`` (no pickle); a pickle planted in a checkpoint, with the checkpoint's manifest
(size, sha256 in state.json) rewritten to match as an attacker would, is never unpickled: the resume is refused
with nothing run or changed, and the run is not lost (it resumes to the adapters of an undamaged resume once the
planted file is gone, or from the checkpoint before). A checkpoint of an older version (pickled task state) is
refused with the conversion command, which converts it reading plain data only. The trainer's tensor files:
``tests/plugins/trainers/test_trainers.py`` and ``tests/core/test_loop_e2e.py`` (the real stack).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from populora_core.run.loop import execute
from populora_core.run.state import TASK_STATE_FORMAT, read_task_state
from tests.cli_helpers import invoke_cli
from tests.core import test_resume_damage as damage
from tests.core.test_resume_damage import FAKE, LAST, OLDER, _adapter_hashes, _files, _resume

# the damage tests' run: the fake stack's 2T2S recipe, 4 steps, checkpoints 3 and 4 kept, and an undamaged resume's
# adapters at 6 steps
fake_model, finished, reference = damage.fake_model, damage.finished, damage.reference


class _Payload:
    """Unpickling this runs ``touch MARKER``: what a hostile checkpoint would do with os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(checkpoint: Path, rel: str, data: bytes) -> None:
    """Write ``data`` at ``checkpoint/rel`` and record it in the checkpoint's manifest, so it passes the size and
    sha256 checks of an intact checkpoint."""
    file = checkpoint / rel
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(data)
    state = json.loads((checkpoint / "state.json").read_text())
    state["manifest"]["checkpoint"][rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "state.json").write_text(json.dumps(state))


def _unchanged(path: Path) -> dict[str, bytes]:
    """The run's files but the lock (which holds the pid of whoever last took it)."""
    return {k: v for k, v in _files(path).items() if k != ".lock"}


def unrecord(checkpoint: Path, rel: str) -> None:
    (checkpoint / rel).unlink()
    state = json.loads((checkpoint / "state.json").read_text())
    del state["manifest"]["checkpoint"][rel]
    (checkpoint / "state.json").write_text(json.dumps(state))


def test_task_state_is_json_data_in_its_format(finished):
    assert not list(finished.rglob("*.pkl"))
    for checkpoint in (finished / LAST, finished / OLDER):
        assert sorted(p.name for p in (checkpoint / "tasks").iterdir()) == ["count.json"]
        data = json.loads((checkpoint / "tasks" / "count.json").read_text())
        assert data["format"] == TASK_STATE_FORMAT and data["task"] == "count"
        assert data["state"]["buffer"] and all(isinstance(p, dict) for p in data["state"]["buffer"])
        assert read_task_state(checkpoint, "count") == data["state"]


@pytest.mark.parametrize("where", ["tasks/count.pkl", "tasks/count.json"], ids=["beside the json", "as the json"])
def test_a_planted_pickle_is_never_unpickled_and_the_run_is_not_lost(finished, reference, tmp_path, where):
    path = tmp_path / "run"
    shutil.copytree(finished, path)
    marker = tmp_path / "PWNED"
    plant(path / LAST, where, pickle.dumps(_Payload(marker)))
    before = _unchanged(path)
    refused = invoke_cli("--plugin", FAKE, "resume", str(path), "steps=6", "--no-progress")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert not marker.exists(), "resume unpickled the planted file"
    assert _unchanged(path) == before, "a refused resume changed the run"
    if where.endswith(".pkl"):
        assert f"holds pickled task state ({LAST}/tasks/count.pkl)" in refused.stderr
        assert f"populora convert-checkpoints {path}" in refused.stderr
        converted = invoke_cli("convert-checkpoints", str(path))
        assert converted.returncode == 2 and "Traceback" not in converted.stderr, converted.stderr
        assert "it names posix.system, not plain data" in converted.stderr
        assert not marker.exists() and _unchanged(path) == before
        unrecord(path / LAST, where)  # the planted file gone: the run resumes as if nothing happened
    else:
        assert f"{path / LAST / 'tasks' / 'count.json'}: not task state (JSON expected" in refused.stderr
        assert "nothing was read or changed" in refused.stderr
        shutil.move(path / LAST, tmp_path / "set-aside")  # the way out: the checkpoint before it
    run = _resume(path)  # in the process that was refused: the refusal let the run's lock go
    assert run.step == (4 if where.endswith(".pkl") else 3)
    execute(run)
    assert _adapter_hashes(path) == reference
    assert not marker.exists()


def test_an_old_checkpoint_is_refused_with_the_command_that_converts_it_once(finished, reference, tmp_path):
    """What an older version wrote: tasks/count.pkl (plain data). The resume names the command, which converts every
    checkpoint; the converted run resumes to the adapters of an undamaged resume."""
    path = tmp_path / "run"
    shutil.copytree(finished, path)
    for checkpoint in (path / LAST, path / OLDER):
        state = read_task_state(checkpoint, "count")
        unrecord(checkpoint, "tasks/count.json")
        plant(checkpoint, "tasks/count.pkl", pickle.dumps(state))
    before = _unchanged(path)
    refused = invoke_cli("--plugin", FAKE, "resume", str(path), "steps=6", "--no-progress")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"Convert the run once with `populora convert-checkpoints {path}`" in refused.stderr
    assert _unchanged(path) == before
    converted = invoke_cli("convert-checkpoints", str(path))
    assert converted.returncode == 0, converted.stderr
    assert converted.stdout.strip() == f"converted 2 task state file(s) of {path} to JSON"
    assert not list(path.rglob("*.pkl"))
    assert invoke_cli("convert-checkpoints", str(path)).stdout.strip() == f"{path}: nothing to convert"
    run = _resume(path)
    assert run.step == 4 and not run.dir.notes  # the manifest records the converted files: intact
    execute(run)
    assert _adapter_hashes(path) == reference


def test_a_task_state_that_is_not_json_data_is_the_plugins_error(tmp_path):
    from populora_core.api.errors import PluginError
    from populora_core.run.state import write_task_state

    with pytest.raises(PluginError, match=r"task 'count': state_dict\(\) must return JSON data"):
        write_task_state(tmp_path, "count", {"buffer": [object()]})
    assert not list(tmp_path.iterdir())
    (tmp_path / "tasks").mkdir()
    write_task_state(tmp_path / "tasks", "count", {"buffer": [("a", 1)]})
    assert read_task_state(tmp_path, "count") == {"buffer": [["a", 1]]}  # JSON: a tuple comes back as a list
