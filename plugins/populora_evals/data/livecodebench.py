"""LiveCodeBench problems: public tests decoded when read, private tests (compressed) left where they are until
graded, and LiveCodeBench's contest-date window."""

from __future__ import annotations

import base64
import datetime
import io
import json
import pickle
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from populora_core.api import UserError

from .records import RecordError, parse_each, read_line_at, record_label

LCB_FIELDS = ("question_id", "question_content", "starter_code", "public_test_cases", "private_test_cases", "metadata")


LCB_EXPECTED = (
    "LiveCodeBench code_generation_lite jsonl (test*.jsonl files or their directory) with "
    "fields question_id, question_content, starter_code, public_test_cases, "
    "private_test_cases, metadata (optional: question_title, platform, contest_date, "
    "difficulty)"
)


class _StringOnlyUnpickler(pickle.Unpickler):
    """LCB compresses private tests as base64(zlib(pickle(json str))): allow plain data, no classes."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def decode_lcb_tests(raw: Any) -> list[dict[str, Any]]:
    """Test cases from a JSON string, a list, or LCB's compressed private-test encoding (checked)."""
    if isinstance(raw, list):
        tests = raw
    elif not isinstance(raw, str):
        raise RecordError(f"test cases must be a JSON string or list, not {type(raw).__name__}")
    else:
        try:
            tests = json.loads(raw)
        except json.JSONDecodeError:
            blob = zlib.decompress(base64.b64decode(raw))
            tests = json.loads(_StringOnlyUnpickler(io.BytesIO(blob)).load())
    if not isinstance(tests, list):
        raise RecordError("test cases are not a list")
    for t in tests:
        if not isinstance(t, dict) or t.get("testtype") not in ("stdin", "functional"):
            raise RecordError("each test needs input, output and testtype stdin|functional")
        if "input" not in t or "output" not in t:
            raise RecordError("each test needs input, output and testtype stdin|functional")
    return tests


def lcb_items(
    rows: Iterable[dict[str, Any]],
    benchmark: str,
    origin: str,
    skipped: list[str] | None = None,
    file: Path | None = None,
) -> list[dict[str, Any]]:
    """LiveCodeBench problems; their private tests stay where they are until graded (:func:`lcb_tests`).

    A row read from a plain .jsonl ``file`` (it carries ``"__offset"``) keeps only where its line is;
    other rows keep the still-compressed string. Public tests are small and decoded now.
    """

    def one(r: dict[str, Any], i: int) -> dict[str, Any]:
        missing = [f for f in LCB_FIELDS if f not in r]
        if missing:
            raise UserError(
                f"{benchmark}: {origin} {record_label(i, r)} lacks field {missing[0]!r} "
                f"(has {sorted(r)[:8]}); expected {LCB_EXPECTED}"
            )
        public = decode_lcb_tests(r["public_test_cases"])
        meta = r["metadata"] if isinstance(r["metadata"], dict) else json.loads(r["metadata"] or "{}")
        if not isinstance(meta, dict):
            raise RecordError("metadata is not a JSON object")
        private: dict[str, Any]
        if file is not None and "__offset" in r:
            private = {"file": str(file), "offset": r["__offset"]}
        else:
            private = {"raw": r["private_test_cases"]}
        functional = any(t["testtype"] == "functional" for t in public)
        if functional and not meta.get("func_name"):
            raise RecordError("functional tests need metadata.func_name")
        return {
            "id": f"lcb/{r['question_id']}",
            "question": r["question_content"],
            "starter_code": r["starter_code"] or "",
            "public_tests": public,
            "private_tests": private,
            "func_name": meta.get("func_name"),
            "contest_date": str(r.get("contest_date") or ""),
        }

    return parse_each(rows, benchmark, origin, one, skipped, LCB_EXPECTED)


def lcb_tests(item: dict[str, Any]) -> list[dict[str, Any]]:
    """Every test of a LiveCodeBench problem, its private tests decompressed now (at grading).

    Raises :class:`RecordError` (or another of :data:`RECORD_ERRORS`) when they cannot be read.
    """
    private = item["private_tests"]
    raw = (
        private["raw"]
        if "raw" in private
        else read_line_at(Path(private["file"]), private["offset"])["private_test_cases"]
    )
    tests = item["public_tests"] + decode_lcb_tests(raw)
    if any(t["testtype"] == "functional" for t in tests) and not item.get("func_name"):
        raise RecordError("functional tests need metadata.func_name")
    return tests


def _contest_time(text: str) -> datetime.datetime | None:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment.replace(tzinfo=None)


def between(items: list[dict[str, Any]], start: str | None, end: str | None) -> list[dict[str, Any]]:
    """LiveCodeBench problems in LiveCodeBench's date window: ``start <= contest_date <= end``.

    As ``lcb_runner`` compares them: ``start`` and ``end`` are midnight of those days and the contest
    date keeps its time, so a contest at 18:30 on the end date is left out. Undated problems are kept.
    """
    lo = datetime.datetime.strptime(start, "%Y-%m-%d") if start else None
    hi = datetime.datetime.strptime(end, "%Y-%m-%d") if end else None
    kept = []
    for it in items:
        moment = _contest_time(it["contest_date"]) if it["contest_date"] else None
        if moment is not None and ((lo and moment < lo) or (hi and moment > hi)):
            continue
        kept.append(it)
    return kept
