"""Reading benchmark record files, whatever the benchmark: jsonl (gzipped or not), json, parquet, streamed or
whole, their sha256, the fields a benchmark needs checked, and a record that cannot be read skipped with a warning
and counted instead of ending the run."""

from __future__ import annotations

import gzip
import hashlib
import json
import pickle
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from populora_core.api import UserError

#: What every loader returns: the items and the files they were read from.
Loaded = tuple[list[dict[str, Any]], list[Path]]


class SkippedRecordWarning(UserWarning):
    """A benchmark record that could not be read was left out (the benchmark goes on without it)."""


class RecordError(ValueError):
    """One record cannot be read: it is skipped, named in a warning and counted (``skipped``)."""


#: What reading one record may raise: skipped with a warning, never a traceback. (Not KeyError or
#: AttributeError: a missing field is a file of the wrong shape, checked by :func:`require` first.)
RECORD_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,  # RecordError, JSONDecodeError, binascii.Error, int digits over the limit
    TypeError,
    SyntaxError,
    RecursionError,
    MemoryError,
    OverflowError,
    zlib.error,
    pickle.UnpicklingError,
    EOFError,
)


def record_label(index: int, row: Any) -> str:
    """``record 7 (Mbpp/124)``: the 1-based record number and the record's own id where it has one."""
    rid = None
    if isinstance(row, dict):
        rid = next((row[k] for k in ("task_id", "question_id", "id", "unique_id", "idx") if k in row), None)
    return f"record {index + 1}" + (f" ({rid})" if rid is not None else "")


def skip(skipped: list[str] | None, benchmark: str, origin: str, label: str, exc: BaseException) -> None:
    """Name the unreadable record and why in a warning, and count it in ``skipped``."""
    reason = str(exc) if isinstance(exc, RecordError) else f"{type(exc).__name__}: {exc}"
    note = f"{benchmark}: skipped {origin} {label}: {reason[:300]}"
    if skipped is not None:
        skipped.append(note)
    warnings.warn(note, SkippedRecordWarning, stacklevel=3)


def parse_each(
    rows: Iterable[dict[str, Any]],
    benchmark: str,
    origin: str,
    parse_one: Callable[[dict[str, Any], int], dict[str, Any]],
    skipped: list[str] | None,
    expected: str,
) -> list[dict[str, Any]]:
    """``parse_one`` on every row; a row it cannot read is skipped (warning + count), never fatal.

    A file none of whose records can be read is still an error: a :class:`UserError` naming the first
    record and why.
    """
    items: list[dict[str, Any]] = []
    first: str | None = None
    count = 0
    for i, row in enumerate(rows):
        count += 1
        try:
            items.append(parse_one(row, i))
        except RECORD_ERRORS as exc:
            first = first or f"{record_label(i, row)}: {exc}"
            skip(skipped, benchmark, origin, record_label(i, row), exc)
    if count and not items:
        raise UserError(f"{benchmark}: no record of {origin} can be read ({first}); expected {expected}")
    return items


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def files_sha256(paths: Iterable[Path]) -> dict[str, str]:
    return {str(p): file_sha256(p) for p in sorted(paths)}


def _opener(path: Path) -> Callable[..., IO[Any]]:
    return gzip.open if path.name.endswith(".gz") else open


def jsonl_lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(index, byte offset, line) of every non-blank line, read one at a time (never the whole file).

    Offsets are positions in the file for plain files, in the decompressed stream for ``.gz``.
    """
    with _opener(path)(path, "rb") as fh:
        offset, index = 0, 0
        for line in fh:
            if line.strip():
                yield index, offset, line
                index += 1
            offset += len(line)


def read_line_at(path: Path, offset: int) -> dict[str, Any]:
    """The JSON record on the line starting at ``offset`` of a plain .jsonl file."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        row = json.loads(fh.readline())
    if not isinstance(row, dict):
        raise RecordError(f"the line at byte {offset} of {path} is no longer a JSON object")
    return row


def stream_records(
    path: Path, benchmark: str, expected: str, skipped: list[str] | None = None, with_offsets: bool = False
) -> Iterator[dict[str, Any]]:
    """Rows of a .jsonl / .jsonl.gz file one line at a time; an unreadable line is skipped and counted.

    With ``with_offsets`` each row also carries ``"__offset"``, its line's byte offset (plain files).
    A file of which no line is JSON, or whose lines are not objects, is a :class:`UserError`.
    """
    if not path.is_file():
        raise UserError(f"{benchmark}: data file not found: {path} (expected {expected})")
    read = bad = 0
    first_error: BaseException | None = None
    try:
        for index, offset, line in jsonl_lines(path):
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                bad += 1
                first_error = first_error or exc
                skip(skipped, benchmark, str(path), f"record {index + 1}", exc)
                continue
            if not isinstance(row, dict):
                raise UserError(f"{benchmark}: {path} record {index + 1} is not a JSON object; expected {expected}")
            read += 1
            if with_offsets:
                row["__offset"] = offset
            yield row
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(
            f"{benchmark}: cannot read {path} as JSON lines ({type(exc).__name__}: {exc}); expected {expected}"
        ) from None
    if not read:
        if bad:
            raise UserError(
                f"{benchmark}: cannot read {path} as JSON lines ({type(first_error).__name__}: {first_error}); "
                f"expected {expected}"
            )
        raise UserError(f"{benchmark}: {path} holds no records; expected {expected}")


def read_records(path: Path, benchmark: str, expected: str, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of a .jsonl / .jsonl.gz / .json (list) / .parquet file; UserError with the expected fields if bad.

    JSON lines are read one line at a time; a line that is not JSON is skipped with a warning and
    counted in ``skipped``.
    """
    if not path.is_file():
        raise UserError(f"{benchmark}: data file not found: {path} (expected {expected})")
    if path.name.endswith(".parquet"):
        return _parquet_rows(path, benchmark, expected)
    if path.name.endswith((".json", ".json.gz")) and _starts_with_bracket(path):
        try:
            with _opener(path)(path, "rt", encoding="utf-8") as fh:
                rows = json.load(fh)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, EOFError, zlib.error, RecursionError) as exc:
            raise UserError(
                f"{benchmark}: cannot read {path} as a JSON list ({type(exc).__name__}: {exc}); expected {expected}"
            ) from None
        if not rows:
            raise UserError(f"{benchmark}: {path} holds no records; expected {expected}")
        bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
        if bad is not None:
            raise UserError(f"{benchmark}: {path} record {bad + 1} is not a JSON object; expected {expected}")
        return rows
    return list(stream_records(path, benchmark, expected, skipped))


def _starts_with_bracket(path: Path) -> bool:
    try:
        with _opener(path)(path, "rt", encoding="utf-8") as fh:
            head = fh.read(4096).lstrip()
    except (OSError, UnicodeDecodeError, EOFError, zlib.error):
        return False
    return head.startswith("[")


def _parquet_rows(path: Path, benchmark: str, expected: str) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{benchmark}: cannot read {path} as parquet ({exc}); expected {expected}") from None
    if not rows:
        raise UserError(f"{benchmark}: {path} holds no records; expected {expected}")
    return rows


def require(rows: list[dict[str, Any]], benchmark: str, path: Path | str, fields: Iterable[str], expected: str) -> None:
    """Every row has every field (alternatives as ``a|b``), else a UserError naming what is missing."""
    for i, row in enumerate(rows):
        for field in fields:
            names = field.split("|")
            if not any(n in row for n in names):
                raise UserError(
                    f"{benchmark}: {path} record {i + 1} lacks field {field!r} "
                    f"(has {sorted(row)[:8]}); expected {expected}"
                )


def first_of(row: dict[str, Any], names: str) -> Any:
    for n in names.split("|"):
        if n in row:
            return row[n]
    raise KeyError(names)
