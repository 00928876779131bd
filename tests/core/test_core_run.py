"""Run directory and adapter store: immutable versions, atomic checkpoints, rollback, PEFT round trip."""

from __future__ import annotations

import json

import pytest

from populora_core.api.errors import UserError
from populora_core.api.population import Member, Population
from populora_core.run.recovery import roll_back
from populora_core.run.run_dir import RunDir
from populora_core.services.adapters import adapter_hash, init_lora, is_adapter_dir, load_lora, save_lora


def test_checkpoint_is_atomic_and_latest_always_complete(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "run")
    run.create({"name": "x"})
    run.append("events.jsonl", [{"event": "step", "step": 1}])
    first = run.write_checkpoint(1, {"population": {"members": []}})
    assert run.latest_checkpoint() == first

    def crash(directory):
        (directory / "half").write_text("partial")
        raise KeyboardInterrupt  # a kill while component state is being written

    with pytest.raises(KeyboardInterrupt):
        run.write_checkpoint(2, {"population": {}}, {"trainer": crash})
    assert run.latest_checkpoint() == first  # the previous complete checkpoint is still the one
    assert not list(run.checkpoints.glob(".*"))  # no temporary left behind
    assert run.read_checkpoint(first)["step"] == 1


def test_rollback_truncates_logs_and_drops_newer_adapters(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create({"name": "x"})
    (run.adapters / "s0@v0").mkdir()
    run.append("events.jsonl", [{"step": 1}])
    state = run.read_checkpoint(run.write_checkpoint(1, {"population": {}}))
    run.append("events.jsonl", [{"step": 2}])
    run.append("tasks/problems.jsonl", [{"p": 1}])
    (run.adapters / "s0@v1").mkdir()
    roll_back(run, state)
    assert run.read_log("events.jsonl") == [{"step": 1}]
    assert run.read_log("tasks/problems.jsonl") == []
    assert sorted(p.name for p in run.adapters.iterdir()) == ["s0@v0"]


def test_existing_run_dir_is_refused(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create({"name": "x"})
    with pytest.raises(UserError, match="already holds a run"):
        run.create({"name": "x"})


def test_adapter_versions_round_trip_through_peft_and_are_immutable(tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    weights = init_lora(
        str(tiny_model_dir), rank=4, alpha=8, target_modules=["q_proj", "v_proj"], seed=1, init_std=0.02
    )
    path = save_lora(weights, tmp_path / "s0@v0")
    assert is_adapter_dir(path) and len(adapter_hash(path)) == 64
    with pytest.raises(FileExistsError, match="immutable"):
        save_lora(weights, path)
    again = load_lora(path)
    assert again.rank == 4 and again.alpha == 8
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(path))
    state = model.state_dict()
    for name, f in weights.modules.items():
        assert torch.equal(state[f"{name}.lora_B.default.weight"], f.B)
        assert torch.equal(state[f"{name}.lora_A.default.weight"], f.A)
    # same seed, same bytes; another seed, another adapter
    twin = save_lora(
        init_lora(str(tiny_model_dir), rank=4, alpha=8, target_modules=["q_proj", "v_proj"], seed=1, init_std=0.02),
        tmp_path / "twin",
    )
    assert adapter_hash(twin) == adapter_hash(path)


def test_bad_adapter_dirs_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_lora(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="not a PEFT adapter directory"):
        load_lora(tmp_path / "empty")


def test_population_serialises_and_names_versions():
    pop = Population.create(2, 3)
    assert [m.id for m in pop.teachers] == ["t0", "t1"] and len(pop.students) == 3
    m = pop.members["s1"]
    m.version = 4
    assert m.version_name == "s1@v4"
    child = pop.add_new("s", "student")
    assert child.id == "s3"
    clone = Population.from_dict(json.loads(json.dumps(pop.to_dict())))
    assert clone.to_dict() == pop.to_dict()
    shared = Population.create(1, 1, shared=True)
    assert [(m.id, m.teaches, m.solves) for m in shared.members.values()] == [("a0", True, True)]
    with pytest.raises(ValueError, match="role"):
        Member("x", "coach")
