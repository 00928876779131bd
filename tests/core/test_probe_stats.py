"""The probe's statistics: the cluster bootstrap (problems as units, runs nested) and the minimum detectable
effect, each against a case computed by hand."""

from __future__ import annotations

import pytest

from populora_core.services.statistics import cluster_bootstrap, cluster_mde, min_detectable_effect


def test_cluster_bootstrap_draws_whole_problems():
    """Two problems, five runs each, every run solving A and failing B. Drawing problems gives the means
    0, 1/2, 1 with chances 1/4, 1/2, 1/4, so the 95 % interval is [0, 1] and the middle 40 % is 1/2; the
    pooled bootstrap of the ten (run, problem) pairs as if independent is far narrower."""
    runs = [[1.0] * 5, [0.0] * 5]
    assert cluster_bootstrap(runs) == (0.0, 1.0)
    assert cluster_bootstrap(runs, level=0.4) == (0.5, 0.5)
    low, high = cluster_bootstrap([[x] for c in runs for x in c])
    assert 0.1 <= low and high <= 0.9


def test_cluster_bootstrap_pools_observations_and_keeps_strata():
    # unequal clusters: {A, A} -> 1, {A, B} -> 3/4 (three of four observations), {B, B} -> 0
    assert cluster_bootstrap([[1.0, 1.0, 1.0], [0.0]], level=0.4) == (0.75, 0.75)
    # one problem per stratum: every resample draws each stratum's own problem
    assert cluster_bootstrap([[1.0], [0.0]], strata=["a", "b"]) == (0.5, 0.5)
    assert cluster_bootstrap([[1.0], [0.0]], seed=3) == cluster_bootstrap([[1.0], [0.0]], seed=3)
    with pytest.raises(ValueError):
        cluster_bootstrap([[1.0], []])


def test_min_detectable_effect_normal_formula():
    """(z_0.975 + z_0.8) sd / sqrt(n) = (1.959964 + 0.841621) / 10 for sd 1 over 100 units (the textbook 2.8 SE)."""
    assert min_detectable_effect(1.0, 100) == pytest.approx(0.2801585, abs=1e-6)
    assert min_detectable_effect(1.0, 100, alpha=0.01, power=0.9) == pytest.approx((2.575829 + 1.281552) / 10)
    # paired 1/0 outcomes on 150 problems, 13 discordant and balanced: sd**2 = 13/150, about 6.7 points
    assert min_detectable_effect((13 / 150) ** 0.5, 150) == pytest.approx(0.0674, abs=1e-4)
    diffs = [[1.0]] * 7 + [[-1.0]] * 6 + [[0.0]] * 137
    mean = 1 / 150
    sd = ((13 - 150 * mean**2) / 149) ** 0.5
    assert cluster_mde(diffs) == pytest.approx(min_detectable_effect(sd, 150))
    assert cluster_mde([[0.5, 0.5]]) is None and cluster_mde([[0.0], [0.0]]) is None
