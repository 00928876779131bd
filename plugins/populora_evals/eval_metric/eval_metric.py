"""PopuLoRA benchmark metric for `evaluate`: pass@k (unbiased estimator) and accuracy.

`evaluate` ships no metric scripts offline, so the project ships this one. Load it with
``evaluate.load("<path to this directory>")`` (or this file's path).
"""

import datasets
import evaluate

_DESCRIPTION = """
Per problem, `predictions` is the number of correct samples c and `references` the number of samples
n drawn for it. pass@k is the unbiased estimator of Chen et al. (2021),
1 - C(n - c, k) / C(n, k), averaged over problems (problems with n < k are skipped for that k).
accuracy is the mean of c / n (pass@1 when n = 1, i.e. greedy decoding).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of int, correct samples per problem.
    references: list of int, samples drawn per problem.
    k: list of int, the k values of pass@k (default [1]).
Returns:
    dict with "accuracy" and "pass@k" for each k that at least one problem supports.
Examples:
    >>> metric = evaluate.load("plugins/populora_evals/eval_metric")
    >>> metric.compute(predictions=[1, 0], references=[1, 1])
    {'accuracy': 0.5, 'pass@1': 0.5}
"""

_CITATION = """
@article{chen2021codex, title={Evaluating Large Language Models Trained on Code},
 author={Chen, Mark and others}, journal={arXiv:2107.03374}, year={2021}}
"""


def pass_at_k(n, c, k):
    """Unbiased pass@k for one problem, as the numerically stable product form."""
    if n - c < k:
        return 1.0
    prob_all_fail = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_fail *= 1.0 - k / i
    return 1.0 - prob_all_fail


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class EvalMetric(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("int64"),
                    "references": datasets.Value("int64"),
                }
            ),
        )

    def _compute(self, predictions, references, k=None):
        ks = list(k) if k is not None else [1]
        for c, n in zip(predictions, references):
            if n < 1 or c < 0 or c > n:
                raise ValueError(f"need 0 <= correct <= samples and samples >= 1, got {c} of {n}")
        result = {"accuracy": sum(c / n for c, n in zip(predictions, references)) / max(1, len(references))}
        for kk in ks:
            vals = [pass_at_k(n, c, kk) for c, n in zip(predictions, references) if n >= kk]
            if vals:
                result[f"pass@{kk}"] = sum(vals) / len(vals)
        return result
