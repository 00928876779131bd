"""Research: the experiments (study, curriculum, selection, transfer), nano's build tooling and the results.

results.md holds every result; README.md indexes the experiments.
"""
