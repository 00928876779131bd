"""Floor 5, a run: the components built from a recipe (:mod:`.assembly`), the loop and its phases, evolution,
the run directory, checkpoints and resume, metrics, the probe of a run, seeding and the memory plan
(:mod:`.plan`). Imports ``api``, ``services``, ``plugin`` and ``recipe``."""
