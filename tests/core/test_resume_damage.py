"""A resume never destroys a run: every file of a run directory damaged in turn (deleted, truncated, emptied), LATEST
pointing nowhere, both checkpoints damaged, the checkpoints folder gone. Each case resumes from the newest intact
checkpoint to the adapters an undamaged resume makes, or is refused with nothing changed; none loses an intact file.

The run: the fake stack's 2T2S recipe, 4 steps, a checkpoint every step, 2 kept (steps 3 and 4 on disk), resumed
to 6 steps, so a resume from step 3 and one from step 4 must end in the same adapters.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from populora_core.api.errors import UserError
from populora_core.api.population import Population
from populora_core.run.loop import execute, resume_run
from populora_core.run.run_dir import LOGS, RunDir
from tests.cli_helpers import fake_stack_manager, run_cli, run_in_process

TESTS = Path(__file__).resolve().parents[1]
FAKE = str(TESTS / "fake_stack.py")
LAST, OLDER = "checkpoints/00000004", "checkpoints/00000003"


@pytest.fixture(scope="module")
def fake_model(tiny_model_dir):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POPULORA_TEST_MODEL", str(tiny_model_dir))
        yield tiny_model_dir


@pytest.fixture(scope="module")
def finished(fake_model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("damage") / "finished"
    run_in_process(fake_stack_manager(), path, ["steps=4"])
    assert sorted(p.name for p in (path / "checkpoints").iterdir()) == ["00000003", "00000004", "LATEST"]
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _adapter_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root / "adapters")): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "adapters").rglob("*"))
        if p.is_file()
    }


def _resume(path: Path):
    return resume_run(RunDir(path), fake_stack_manager(), ("steps=6",))


@pytest.fixture(scope="module")
def reference(finished, tmp_path_factory) -> dict[str, str]:
    """The adapters an undamaged resume to 6 steps ends with."""
    path = tmp_path_factory.mktemp("damage") / "undamaged"
    shutil.copytree(finished, path)
    run = _resume(path)
    assert run.step == 4 and not run.dir.notes
    execute(run)
    return _adapter_hashes(path)


def _named_by(checkpoint: Path) -> set[str]:
    state = json.loads((checkpoint / "state.json").read_text())
    return {m.version_name for m in Population.from_dict(state["population"]).members.values()}


def _expected_step(finished: Path, damaged: str) -> int | None:
    """The newest checkpoint the damage leaves intact (None: the recipe, restored or refused)."""
    if damaged == "recipe.yaml":
        return None
    if damaged.startswith(LAST + "/"):
        return 3
    if damaged.startswith("adapters/") and damaged.split("/")[1] in _named_by(finished / LAST):
        return 3
    return 4


def _damage(file: Path, how: str) -> None:
    if how == "deleted":
        file.unlink()
    elif how == "emptied":
        file.write_bytes(b"")
    else:
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _assert_nothing_intact_lost(before: dict[str, bytes], path: Path, damaged: str) -> None:
    """Every file but the damaged one is where it was with its bytes, or set aside in RUN/damaged/ with them (a
    log: its lines up to the resume point in place, the rest set aside)."""
    after = _files(path)
    aside = {name.split("/", 2)[2]: data for name, data in after.items() if name.startswith("damaged/")}
    for name, data in before.items():
        if name in (damaged, "checkpoints/LATEST") or after.get(name) == data or aside.get(name) == data:
            continue
        if name == "recipe.yaml":  # rewritten by the resume's steps=6, nothing else
            assert {**yaml.safe_load(data), "steps": 6} == yaml.safe_load(after[name]), "recipe.yaml changed"
            continue
        if name in LOGS:
            kept = after.get(name, b"")
            tails = [v for k, v in aside.items() if k.startswith(f"{name}.after-step-")]
            assert data.startswith(kept) and tails == [data[len(kept) :]], f"{name}: lines lost"
            continue
        raise AssertionError(f"{name} was lost: neither in place nor set aside")


def _cases(finished: Path) -> list[tuple[str, str]]:
    return [(name, how) for name in _files(finished) for how in ("deleted", "truncated", "emptied")]


@pytest.mark.slow
def test_every_file_damaged_resumes_from_the_newest_intact_checkpoint_or_is_refused(finished, reference, tmp_path):
    cases = _cases(finished)
    assert len(cases) >= 60  # every file of the run: recipe, logs, members, adapters, both checkpoints, LATEST
    outcomes = {}
    for k, (name, how) in enumerate(cases):
        path = tmp_path / f"case{k}"
        shutil.copytree(finished, path)
        _damage(path / name, how)
        before = _files(path)
        expected = _expected_step(finished, name)
        try:
            run = _resume(path)
        except UserError as exc:
            assert _files(path) == before, f"{name} {how}: a refused resume changed the run"
            assert expected is None, f"{name} {how}: refused ({exc}) though checkpoint {expected} is intact"
            outcomes[(name, how)] = "refused"
            continue
        if expected is not None:
            assert run.step == expected, f"{name} {how}: resumed from {run.step}, not {expected}"
        _assert_nothing_intact_lost(before, path, name)
        outcomes[(name, how)] = run.step
        execute(run)
        unneeded = name.removeprefix("adapters/")  # a version no checkpoint restores stays as the damage left it
        got, want = (({k: v for k, v in h.items() if k != unneeded}) for h in (_adapter_hashes(path), reference))
        assert got == want, f"{name} {how}: other adapters than an undamaged resume's"
    assert outcomes[(f"{LAST}/state.json", "truncated")] == 3  # the torn state that used to be a traceback
    assert outcomes[("recipe.yaml", "deleted")] == 4  # restored from the checkpoint's copy
    assert list(outcomes.values()).count(3) >= 12


def test_latest_naming_no_checkpoint_resumes_from_the_newest_intact_one(finished, reference, tmp_path):
    """Both ways LATEST used to make a resume start over and delete everything."""
    for k, (target, expected) in enumerate((("00000009", 4), ("garbage", 4))):
        path = tmp_path / f"latest{k}"
        shutil.copytree(finished, path)
        (path / "checkpoints" / "LATEST").write_text(target + "\n")
        run = _resume(path)
        assert run.step == expected
        execute(run)
        assert _adapter_hashes(path) == reference


def test_the_newest_checkpoint_missing_resumes_from_the_older_and_says_so(finished, reference, tmp_path):
    """The issue's case: checkpoint 32 deleted, 28 intact, LATEST naming 32: 28 it is, with the reason."""
    path = tmp_path / "run"
    shutil.copytree(finished, path)
    shutil.rmtree(path / LAST)
    run = _resume(path)
    assert run.step == 3
    assert any("checkpoint 4 (00000004): missing (LATEST names it)" in note for note in run.dir.notes)
    assert (path / OLDER).is_dir()
    execute(run)
    assert _adapter_hashes(path) == reference


@pytest.mark.parametrize("how", ["both checkpoints torn", "checkpoints folder deleted", "every adapter deleted"])
def test_a_run_without_an_intact_checkpoint_is_refused_and_left_as_it_was(finished, tmp_path, how):
    path = tmp_path / "run"
    shutil.copytree(finished, path)
    if how == "both checkpoints torn":
        for checkpoint in (LAST, OLDER):
            _damage(path / checkpoint / "state.json", "truncated")
    elif how == "checkpoints folder deleted":
        shutil.rmtree(path / "checkpoints")
    else:
        shutil.rmtree(path / "adapters")
        (path / "adapters").mkdir()
    before = _files(path)
    with pytest.raises(UserError, match=r"is damaged and has no intact checkpoint.*Nothing was changed"):
        _resume(path)
    assert _files(path) == before


def test_cli_names_the_damage_and_runs_lists_it(finished, tmp_path):
    """`populora runs` says from which step a damaged run resumes; `resume` of a run with none intact is exit 2
    naming what is damaged and the way out, no traceback."""
    root = tmp_path / "runs"
    shutil.copytree(finished, root / "skips")
    _damage(root / "skips" / LAST / "state.json", "truncated")
    shutil.copytree(finished, root / "lost")
    for checkpoint in (LAST, OLDER):
        (root / "lost" / checkpoint / "state.json").unlink()
    listed = run_cli("runs", str(root), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {Path(r["path"]).name: r["status"] for r in json.loads(listed.stdout)}
    assert rows == {"skips": "damaged (resumes from step 3)", "lost": "damaged (no intact checkpoint)"}
    before = _files(root / "lost")
    refused = run_cli("--plugin", FAKE, "resume", str(root / "lost"), "--no-progress")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "checkpoint 4 (00000004): state.json is missing" in refused.stderr
    assert f"populora run {root / 'lost'}/recipe.yaml --run-dir NEW_DIR" in refused.stderr
    assert _files(root / "lost") == before


def test_a_recipe_changed_beyond_steps_and_cluster_is_refused(finished, tmp_path):
    path = tmp_path / "run"
    shutil.copytree(finished, path)
    recipe = path / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("seed: 3", "seed: 4"))
    before = _files(path)
    with pytest.raises(UserError, match=r"differs from the recipe checkpoint 4 was made with in seed"):
        _resume(path)
    assert _files(path) == before
