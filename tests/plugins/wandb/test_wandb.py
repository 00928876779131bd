"""The wandb sink offline: the step metrics, probe accuracies and the run config arrive in W&B's own run file."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.cli_helpers import as_if_killed_after, run_cli

TESTS = Path(__file__).resolve().parents[2]
FAKE = str(TESTS / "fake_stack.py")
RECIPE = str(TESTS / "recipes" / "fake_2t2s.yaml")


def _records(run_file: Path) -> list:
    """The protobuf records of a ``.wandb`` file: a 7-byte header, then LevelDB-log chunks in 32 KiB blocks
    (checksum 4 bytes, length 2, type 1: full, first, middle, last), as wandb-core writes them."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, out, chunk = 7, 32 * 1024, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        kind = data[pos + 6] if left >= 7 else 0
        if kind == 0:  # the zero padding at a block's end
            pos += left
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            out.append(record)
            chunk = b""
    return out


def _offline_runs(wandb_dir: Path) -> list[Path]:
    return sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))


def test_offline_run_holds_every_step_metric_the_probe_and_the_recipe(tiny_model_dir, tmp_path):
    probe = tmp_path / "probe.jsonl"
    problems = ({"task_type": "count", "program": str(d), "inputs": [str(d)], "outputs": [str(d)]} for d in range(6))
    probe.write_text("".join(json.dumps(p) + "\n" for p in problems))
    run_dir, wandb_dir = tmp_path / "run", tmp_path / "wandb-files"
    env = {
        "POPULORA_TEST_MODEL": str(tiny_model_dir),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(wandb_dir),
    }
    sink = "sinks=[{name: wandb, params: {project: populora-test, group: arm-a, tags: [t1]}}]"
    args = ["steps=3", "probe.enabled=true", f"probe.file={probe}", sink, "--run-dir", str(run_dir), "--no-progress"]
    result = run_cli("--plugin", FAKE, "run", RECIPE, *args, env=env)
    assert result.returncode == 0, result.stderr
    (run_file,) = _offline_runs(wandb_dir)
    records = _records(run_file)

    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name, run.run_group, list(run.tags)) == ("populora-test", "run", "arm-a", ["t1"])
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    assert {k: config[k] for k in recipe} == recipe  # the resolved recipe, sinks and all
    assert (run_dir / "wandb_run_id").read_text().strip() == run.run_id

    rows: dict[int, dict] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            rows.setdefault(row["_step"], {}).update(row)
    assert sorted(rows) == [0, 1, 2, 3]  # the base's probe at step 0, then every step
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    for event in (e for e in events if e["event"] == "step"):
        numbers = {k: v for k, v in event.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        del numbers["step"]
        assert len(numbers) > 20 and {k: rows[event["step"]][k] for k in numbers} == numbers
    for event in (e for e in events if e["event"] == "probe"):
        assert rows[event["step"]][f"probe/{event['member']}/{event['task_type']}"] == event["accuracy"]
    assert "probe/base/count" in rows[0] and "matches" not in rows[1]  # lists are not metrics

    # a resumed run continues the same W&B run (from the checkpoint before the last: a finished run is left alone)
    as_if_killed_after(run_dir, 2)
    resumed = run_cli("--plugin", FAKE, "resume", str(run_dir), "--no-progress", env=env)
    assert resumed.returncode == 0, resumed.stderr
    first, second = _offline_runs(wandb_dir)
    runs = [next(r.run for r in _records(f) if r.WhichOneof("record_type") == "run") for f in (first, second)]
    assert runs[0].run_id == runs[1].run_id == run.run_id


def test_bad_params_are_a_user_error(tiny_model_dir, tmp_path):
    env = {"POPULORA_TEST_MODEL": str(tiny_model_dir), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
    sink = "sinks=[{name: wandb, params: {mode: sometimes}}]"
    result = run_cli("--plugin", FAKE, "validate", RECIPE, sink, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "mode" in result.stderr and "wandb" in result.stderr


def test_an_online_resume_rewinds_the_wandb_run_to_its_checkpoint(tmp_path, monkeypatch):
    """Online, a resumed run's W&B history is rewound to the checkpoint (``resume_from``), so the steps logged
    after it are not held twice; offline (no rewind there) and for a new run the id is continued or made."""
    import sys
    import types

    from populora_wandb import WandbParams, WandbSink

    calls: list[dict] = []
    fake = types.SimpleNamespace(init=lambda **kw: calls.append(kw) or types.SimpleNamespace(id="abc123"))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    (tmp_path / "recipe.yaml").write_text("name: r\n")
    WandbSink(WandbParams(mode="online"), run_dir=tmp_path)  # a new run: wandb makes the id
    assert calls[-1]["id"] is None and "resume" not in calls[-1] and "resume_from" not in calls[-1]
    assert (tmp_path / "wandb_run_id").read_text().strip() == "abc123"
    WandbSink(WandbParams(mode="online"), run_dir=tmp_path, resume_step=4)
    assert calls[-1]["resume_from"] == "abc123?_step=5" and calls[-1]["id"] is None and "resume" not in calls[-1]
    WandbSink(WandbParams(mode="offline"), run_dir=tmp_path, resume_step=4)
    assert calls[-1]["id"] == "abc123" and calls[-1]["resume"] == "allow" and "resume_from" not in calls[-1]
