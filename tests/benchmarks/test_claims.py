"""The claims table of a world with a held-out evaluator: outcomes read from `populora eval`'s samples, planted
differences found overall and per level, and run-level claims paired by seed."""

from __future__ import annotations

import json
import random

import pytest

from benchmarks.research import claims

IDS = [f"L{lv}/{k}" for k in range(30) for lv in (1, 2, 3)]


def _models(rng: random.Random, shift: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per-sample accuracies (eighths) of a base and members, each member ``shift`` points above the base."""
    base = {i: rng.randrange(9) / 8 for i in IDS}
    out = {"base": base}
    for member, d in shift.items():
        out[member] = {i: min(1.0, max(0.0, base[i] + d + rng.choice((-1, 0, 1)) / 8)) for i in IDS}
    return out


def test_read_heldout_takes_each_models_share_of_right_samples(tmp_path):
    for label, rows in {"base": [[1, 0, 0, 0]], "s0@v40": [[1, 1, 1, 0]]}.items():
        folder = tmp_path / "samples" / label
        folder.mkdir(parents=True)
        (folder / "arith_heldout.jsonl").write_text(json.dumps({"id": "L2/0", "correct": rows[0]}) + "\n")
    assert claims.read_heldout(tmp_path, "arith_heldout") == {"base": {"L2/0": 0.25}, "s0@v40": {"L2/0": 0.75}}


def test_arm_outcomes_names_best_and_weakest_by_overall_accuracy():
    models = _models(random.Random(0), {"s0@v9": 0.2, "s1@v9": -0.1, "s2@v9": 0.05})
    arm = claims.arm_outcomes(models)
    assert arm["best"] == [models["s0@v9"][i] for i in arm["ids"]]
    assert arm["weakest"] == [models["s1@v9"][i] for i in arm["ids"]]
    assert arm["mean"][0] == pytest.approx(sum(models[m][arm["ids"][0]] for m in ("s0@v9", "s1@v9", "s2@v9")) / 3)


def test_heldout_claims_find_a_planted_gain_overall_and_per_level_with_seeds_nested():
    rng = random.Random(1)
    seeds = []
    for _ in range(3):
        pop = claims.arm_outcomes(_models(rng, {"s0": 0.25, "s1": 0.25}))
        single = claims.arm_outcomes({"base": dict(zip(pop["ids"], pop["base"])),
                                      "t0": dict(zip(pop["ids"], pop["base"]))})  # fmt: skip
        seeds.append({"population": pop, "baseline": single})
    rows = {(r["claim"], r["level"]): r for r in claims.heldout_claims(seeds)}
    overall = rows[("population mean - single agent", "all")]
    assert overall["problems"] == len(IDS) and 0.15 < overall["mean"] < 0.3
    assert overall["low"] > 0.1 and overall["mde"] < 0.1
    assert rows[("single agent - base", "all")]["mean"] == 0.0
    assert rows[("population mean - single agent", "L2")]["problems"] == 30
    assert {lv for _, lv in rows} == {"all", "L1", "L2", "L3"}


def test_run_claims_pool_each_arm_and_pair_the_difference_by_seed():
    runs = [
        {"population": {"difficulty_slope": 0.05 + d}, "baseline": {"difficulty_slope": -0.01 + d / 2}}
        for d in (0.0, 0.01, 0.02, -0.01)
    ]
    rows = {r["measure"]: r for r in claims.run_claims(runs, lambda r, arm, key: r[arm].get(key))}
    slope = rows["difficulty_slope"]
    assert slope["difference"]["mean"] == pytest.approx(0.0625)
    assert slope["population"]["mean"] == pytest.approx(0.055)
    # the detectable effect exceeds the interval's half-width by z_0.8 standard errors
    half = slope["difference"]["high"] - slope["difference"]["mean"]
    assert slope["difference"]["mde"] == pytest.approx(half + 0.8416 * 0.00645497 / 2, rel=1e-3)
    assert rows["coverage/new_per_step"]["population"]["mean"] is None  # a measure no run reported
    text = claims.table([], list(rows.values()), 4, "arith_heldout")
    assert "teacher difficulty slope" in text and "+0.0625" in text
