"""Answers written to a file (`--output FILE`), the format chosen by the name's suffix: `.json` one JSON
object, `.csv` one flat row per plan (or per point, node type, run: `optimizer.report.table`), any other name
the text report. JSON has no Infinity or NaN: they are written as null."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optimizer.errors import ProblemError


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float as None (numpy scalars as Python numbers), for JSON."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return finite(obj.item())
    return obj


def to_json(obj: Any) -> str:
    """One JSON object, indented, non-finite numbers as null."""
    return json.dumps(finite(obj), indent=2, allow_nan=False, default=str)


def check_writable(path: str | Path, flag: str = "--output") -> None:
    """Refuse (exit 2, naming `flag`) an output that cannot be written, before any work is done: a
    directory, a missing parent folder, a read-only place. A file that did not exist is not left behind."""
    path = Path(path)
    if path.is_dir():
        raise ProblemError(flag, None, None, f"cannot write {path}: it is a directory")
    existed = path.exists()
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as e:
        raise ProblemError(flag, None, None, f"cannot write {path}: {e.strerror}") from None
    if not existed:
        path.unlink(missing_ok=True)


def check_writable_folder(folder: str | Path, flag: str = "--plot") -> None:
    """Refuse (exit 2, naming `flag`) a folder that cannot be made or written into, before any work is done
    (a folder made here to try is removed again)."""
    folder = Path(folder)
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        check_writable(folder / ".paraplan-write-check", flag)
    except OSError as e:
        raise ProblemError(flag, None, None, f"cannot write into {folder}: {e.strerror}") from None
    finally:
        if made and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def write(path: str | Path, text: str, obj: Any, rows: list[dict] | None, parquet: bool = False) -> None:
    """Write the answer to `path` by its suffix (module docstring); `rows` None: the command has no rows, so a
    CSV name is refused. `parquet`: a `.parquet` file of the rows beside a CSV when pyarrow is installed."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        text = to_json(obj)
    elif suffix == ".csv":
        from optimizer.report.table import to_csv

        if rows is None:
            raise ProblemError(
                "--output", None, None, "this command has no rows to write as CSV (name a .json or text file)"
            )
        text = to_csv(rows)
    try:
        path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    except OSError as e:
        raise ProblemError("--output", None, None, f"cannot write {path}: {e.strerror}") from None
    if parquet and suffix == ".csv" and rows is not None:
        write_parquet(rows, path.with_suffix(".parquet"))


def write_parquet(rows: list[dict], path: Path) -> None:
    """The rows as a Parquet table of strings (columns in first-seen order); nothing without pyarrow."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    cols = list(dict.fromkeys(c for r in rows for c in r))
    table = pa.table({c: [None if r.get(c) is None else str(r.get(c)) for r in rows] for c in cols})
    pq.write_table(table, path)
