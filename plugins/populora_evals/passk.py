"""pass@k and accuracy without `evaluate` (the runner uses these; the shipped metric module agrees)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

#: Directory of the `evaluate`-loadable metric module: ``evaluate.load(str(METRIC_PATH))``.
METRIC_PATH = Path(__file__).parent / "eval_metric"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), in product form."""
    if not 0 <= c <= n or n < 1 or k < 1:
        raise ValueError(f"need 0 <= c <= n, n >= 1, k >= 1; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prob_all_fail = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_fail *= 1.0 - k / i
    return 1.0 - prob_all_fail


def summarize(correct: Sequence[Sequence[bool]], ks: Sequence[int] = (1,)) -> dict[str, float]:
    """accuracy (mean fraction correct) and pass@k over problems with at least k samples."""
    if not correct:
        return {"accuracy": 0.0}
    out = {"accuracy": sum(sum(c) / len(c) for c in correct) / len(correct)}
    for k in ks:
        vals = [pass_at_k(len(c), sum(c), k) for c in correct if len(c) >= k]
        if vals:
            out[f"pass@{k}"] = sum(vals) / len(vals)
    return out


def load_metric():
    """The shipped metric through `evaluate` (works offline)."""
    import evaluate

    return evaluate.load(str(METRIC_PATH))
