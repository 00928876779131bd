"""Whether two runs computed the same thing: sha256 of what a run's numbers are (every adapter version's weights,
the probe, the lineage, the problems and the members), not of its logs and timings.

    python scripts/run_fingerprint.py runs/nano                 # one run's fingerprint, as JSON
    python scripts/run_fingerprint.py runs/nano runs/nano-after # exit 1 naming each file that differs

What a refactoring must not change: run the same recipe and seed before and after, then compare.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

#: the files of a run directory whose bytes are its results (logs, events and checkpoints carry wall times)
RESULT_FILES = ("probe.jsonl", "lineage.jsonl", "tasks/problems.jsonl", "members.json")


def fingerprint(run_dir: Path) -> dict[str, str]:
    """Relative path -> sha256 of each result file and of every adapter version's weights."""
    files = [run_dir / name for name in RESULT_FILES if (run_dir / name).is_file()]
    files += sorted((run_dir / "adapters").glob("*/adapter_model.safetensors"))
    if not files:
        raise SystemExit(f"{run_dir}: no run results here (probe.jsonl, adapters/, ...)")
    return {str(f.relative_to(run_dir)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    prints = [fingerprint(Path(a)) for a in argv]
    if len(prints) == 1:
        print(json.dumps(prints[0], indent=1, sort_keys=True))
        return 0
    a, b = prints
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    for key in differ:
        print(f"differs: {key}" if key in a and key in b else f"only in one run: {key}")
    print(
        f"{len(a.keys() & b.keys()) - len([k for k in differ if k in a and k in b])} files identical, {len(differ)} not"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
