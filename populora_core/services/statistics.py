"""Paired statistics over probe problems: a probe problem is the unit of every interval (:func:`cluster_bootstrap`),
the runs and samples on it are nested in it, and :func:`min_detectable_effect` says how large a difference a
design can see; :func:`selection_history`: whether selection compared members, read from a run's lineage. Used by
``populora report``, ``populora eval`` and the research experiments.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any


def cluster_bootstrap(
    clusters: Sequence[Sequence[float]],
    *,
    strata: Sequence[Hashable] | None = None,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval (``level``) of the mean of all observations, resampling whole clusters.

    A cluster is one probe problem; its observations are what every run on it got (a paired difference per
    run or seed, or per sample). All of a problem's runs share its difficulty, so they are drawn together:
    resampling (run, problem) pairs as if independent narrows the interval by up to sqrt(runs per problem)
    when the runs agree. With ``strata`` (one label per cluster, e.g. the task type) clusters are drawn within
    their stratum, each keeping its count. The statistic pools the drawn observations (the mean of cluster
    means when every cluster has as many). Seeded: the same data give the same interval.
    """
    if not clusters or any(len(c) == 0 for c in clusters):
        raise ValueError("cluster_bootstrap needs at least one cluster and an observation in each")
    groups: dict[Hashable, list[tuple[float, int]]] = defaultdict(list)
    for c, label in zip(clusters, strata if strata is not None else [None] * len(clusters), strict=True):
        groups[label].append((sum(c), len(c)))
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        total, count = 0.0, 0
        for members in groups.values():
            for s, n in rng.choices(members, k=len(members)):
                total, count = total + s, count + n
        means.append(total / count)
    means.sort()
    tail = (1 - level) / 2
    return means[int(tail * resamples)], means[int((1 - tail) * resamples) - 1]


def min_detectable_effect(sd: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference a two-sided level-``alpha`` test detects with probability ``power``
    in a paired design of ``n`` independent units (probe problems) whose differences have standard deviation
    ``sd``: ``(z_{1-alpha/2} + z_power) * sd / sqrt(n)``, about 2.80 sd / sqrt(n) at 5 % and 80 % (normal
    approximation). For paired 1/0 outcomes ``sd**2`` is the share of discordant problems minus the squared
    mean difference; with runs nested in a problem, ``sd`` is that of the per-problem mean differences."""
    if n < 1:
        raise ValueError("min_detectable_effect needs n >= 1")
    z = statistics.NormalDist()
    return (z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * sd / math.sqrt(n)


def cluster_mde(clusters: Sequence[Sequence[float]], *, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """:func:`min_detectable_effect` of a paired design over problems, ``sd`` estimated from the clusters'
    mean differences; None with fewer than two clusters or none that differ (no spread to estimate it from:
    two identical models say nothing about the noise of two that differ)."""
    means = [statistics.fmean(c) for c in clusters if len(c)]
    if len(means) < 2 or len(set(means)) == 1:
        return None
    return min_detectable_effect(statistics.stdev(means), len(means), alpha=alpha, power=power)


def selection_history(lineage: list[dict[str, Any]]) -> dict[str, Any]:
    """Did selection compare members, or always kill the newest child? Read from ``lineage.jsonl`` records.

    Replaying the records, for every replacement after a role's first evolution step: whether the member replaced
    was (one of) the youngest of its role (born at the role's latest birth step, when older members lived too),
    the share of such members in the role (what chance gives), and, per evolution step, whether the set of members
    that survived it differs from the set that survived the role's previous one.
    """
    born: dict[str, int] = {}
    role_of: dict[str, str] = {}
    by_step: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for record in lineage:
        role = record.get("role") or record["member"].rstrip("0123456789")  # older logs: the id's prefix
        if not record.get("replaced"):
            born[record["member"]] = int(record["step"])
            role_of[record["member"]] = role
        else:
            by_step.setdefault((int(record["step"]), role), []).append(record)
    hits = counted = 0
    chance = 0.0
    changes = comparisons = 0
    last_survivors: dict[str, set[str]] = {}
    for (step, role), records in sorted(by_step.items()):
        living = {m: b for m, b in born.items() if role_of[m] == role}
        dead = {r["replaced"] for r in records}
        survivors = set(living) - dead
        if role in last_survivors:
            comparisons += 1
            changes += survivors != last_survivors[role]
            newest = max(living.values())
            youngest = {m for m, b in living.items() if b == newest} if newest > min(living.values()) else set()
            for d in dead:
                counted += 1
                hits += d in youngest
                chance += len(youngest) / len(living)
        last_survivors[role] = survivors
        for r in records:
            born.pop(r["replaced"], None)
            born[r["member"]] = step
            role_of[r["member"]] = role
    return {
        "replacements_after_first": counted,
        "youngest_replaced": hits,
        "youngest_replaced_by_chance": chance,
        "survivor_changes": changes,
        "survivor_comparisons": comparisons,
    }
