"""Draw nano's held-out set (the shipped ``plugins/populora_nano/heldout.jsonl``, what the ``nano_heldout`` evaluator
reads) into a file of the user's; the plugin's copy changes only by hand, in a release.

Rebuild and compare (sandbox runs of the corpus's 3000 programs: about a minute on 2 cores)::

    python -m benchmarks.research.nano.make_heldout --out heldout.jsonl
    cmp heldout.jsonl plugins/populora_nano/heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from populora_nano import PROBE_FILE

#: make_model.py's defaults: the corpus (--seed 0, --programs 3000) and the probe (--probe-seed, 50 per type)
CORPUS_SEED, CORPUS_PROGRAMS, PROBE_SEED, PER_TYPE = 0, 3000, 20261130, 50
HELDOUT_SEED = 20261203


def make_heldout(out: Path, seed: int = HELDOUT_SEED, per_type: int = PER_TYPE) -> list[dict[str, Any]]:
    """Draw the held-out set as make_model.py draws the probe, excluding the corpus's and the probe's programs.

    The corpus and probe programs are drawn again from make_model.py's seeds (both are identical for a seed on every
    machine); the probe's must come out among ``probe.jsonl``'s (its first 50 per type; the file holds more, drawn
    later for the probe with power, all excluded too), or the exclusion would be of other programs.
    """
    from populora_core.api import get_registry

    from . import corpus as C
    from .make_model import check_probe

    executor = get_registry().get("executor", "sandbox").build({"workers": 2})
    try:
        probe_programs = C.generate_programs(3 * PER_TYPE, random.Random(PROBE_SEED), executor, chunk=200)
        shipped = {json.loads(line)["program"] for line in PROBE_FILE.read_text().splitlines() if line.strip()}
        if not {p.code for p in probe_programs} <= shipped:
            raise RuntimeError("the probe programs drawn again are not probe.jsonl's: not the shipped nano's seeds")
        seen = {p.code for p in probe_programs}  # what make_model.py kept out of the corpus
        corpus = C.generate_programs(CORPUS_PROGRAMS, random.Random(CORPUS_SEED), executor, exclude=seen)
        seen |= {p.code for p in corpus} | shipped  # and every probe problem, the extended probe's too
        programs = C.generate_programs(3 * per_type, random.Random(seed), executor, exclude=seen, chunk=200)
        records = C.probe_records(programs, per_type, random.Random(seed + 1))
        check_probe(records, executor)
    finally:
        executor.close()
    out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return records


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.research.nano.make_heldout", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--out", type=Path, required=True, help="the file to write (never the plugin's: compare, then copy)"
    )
    ap.add_argument("--seed", type=int, default=HELDOUT_SEED)
    ap.add_argument("--per-type", type=int, default=PER_TYPE)
    args = ap.parse_args(argv)
    records = make_heldout(args.out, args.seed, args.per_type)
    print(f"wrote {len(records)} problems to {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
