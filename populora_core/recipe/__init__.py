"""Floor 4, recipes: YAML reading and ``key.sub=value`` overrides (:mod:`.overrides`), both validation passes and
:func:`~populora_core.recipe.validate.load_recipe` (:mod:`.validate`), and the keys a recipe may set
(:mod:`.keys`, ``populora keys``). The schema itself is :mod:`populora_core.api.schema`. Imports ``api``,
``services`` and ``plugin``."""
