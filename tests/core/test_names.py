"""Names stay home (issue 51): a recipe's name, a member id and an exported version name one folder inside the place
they belong to, or are refused with exit 2 naming the value, before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from populora_core.api.errors import UserError
from populora_core.api.names import MEMBER_ID, SAFE_NAME, VERSION_NAME, check_name
from tests.cli_helpers import REPO, invoke_cli
from tests.core import test_resume_damage as damage
from tests.core.test_resume_damage import FAKE, LAST, _files, _resume

fake_model, finished = damage.fake_model, damage.finished
NANO = str(REPO / "recipes" / "nano.yaml")


@pytest.mark.parametrize("name", ["../../../escaped_run", "a/b", "..", ".hidden", "", "x" * 129, "run name"])
def test_a_run_name_that_would_leave_runs_is_refused_naming_it(tmp_path, name):
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)
    refused = invoke_cli("run", NANO, f"name={name}", "--dry-run", cwd=work)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"name: Value error, {name!r} is not a safe run name" in refused.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [Path("work"), Path("work/runs")]


def test_the_issues_escape_is_refused_and_writes_nothing(tmp_path):
    """``populora run recipes/nano.yaml name=../../../escaped_run`` wrote a whole run three folders above runs/."""
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    refused = invoke_cli("run", NANO, "name=../../../escaped_run", "--no-progress", cwd=work)
    assert refused.returncode == 2 and "'../../../escaped_run' is not a safe run name" in refused.stderr
    assert [p for p in tmp_path.rglob("*") if "escaped" in p.name or p.name == "runs"] == []


def test_safe_names_are_the_shipped_ones():
    for recipe in sorted((REPO / "recipes").glob("*.yaml")):
        name = next(
            line.split(":", 1)[1].strip() for line in recipe.read_text().splitlines() if line.startswith("name:")
        )
        assert check_name(name, SAFE_NAME, "run name") == name
    for ok in ("s0", "t12", "a3"):
        assert check_name(ok, MEMBER_ID, "member id") == ok and check_name(f"{ok}@v7", VERSION_NAME, "version")
    for bad in ("../s0", "s0@v1", "s/0", ".s0", "s0 "):
        with pytest.raises(UserError, match=r"is not a safe name"):
            check_name(bad, MEMBER_ID, "member id")


@pytest.mark.parametrize(
    "member", ["../../OTHER/adapters/t0@v3", "t0@v3/../../../OTHER/adapters/t0@v3", "/abs/t0@v3", "t0@v3x"]
)
def test_export_of_a_name_outside_the_runs_adapters_is_refused_naming_it(finished, tmp_path, member):
    """The issue: ``populora export R "../../OTHER/adapters/t0@v3"`` exported another run's adapter with a card that
    said it came from R."""
    root = tmp_path / "x" / "y"
    shutil.copytree(finished, root / "R")
    other = tmp_path / "OTHER" / "adapters" / "t0@v3"
    shutil.copytree(finished / "adapters" / "s0@v0", other)
    out = tmp_path / "out"
    refused = invoke_cli("--plugin", FAKE, "export", str(root / "R"), member, "--out", str(out))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"member {member!r} is neither a member id (s0) nor a version (s0@v3)" in refused.stderr
    assert not out.exists()


def test_an_adapter_folder_that_links_out_of_the_run_is_refused(finished, tmp_path):
    run = tmp_path / "R"
    shutil.copytree(finished, run)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / "adapters" / "s0@v0", elsewhere)
    (run / "adapters" / "s0@v0").symlink_to(elsewhere)
    refused = invoke_cli("--plugin", FAKE, "export", str(run), "s0@v0", "--out", str(tmp_path / "out"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"adapter version 's0@v0' resolves outside {run / 'adapters'}" in refused.stderr


def test_a_member_id_in_a_checkpoint_that_names_another_folder_is_refused_and_changes_nothing(finished, tmp_path):
    path = tmp_path / "run"
    shutil.copytree(finished, path)
    state_file = path / LAST / "state.json"  # not in its own manifest: an attacker edits it freely
    state = json.loads(state_file.read_text())
    state["population"]["members"][0]["id"] = "../../../escaped"
    state_file.write_text(json.dumps(state))
    before = {k: v for k, v in _files(path).items() if k != ".lock"}
    with pytest.raises(UserError, match=r"member id '../../../escaped' is not a safe name"):
        _resume(path)
    assert {k: v for k, v in _files(path).items() if k != ".lock"} == before
    assert not list(tmp_path.rglob("escaped*"))
