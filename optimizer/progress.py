"""Progress on long work: a `rich` bar with ETA on stderr, only when stderr is a terminal and `--quiet` is not
given (so pipes, CI and JSON output stay clean).

    with progress("procure: node types", total=len(types)) as step:
        for t in types:
            ...
            step()
"""

from __future__ import annotations

import contextlib
import sys

QUIET = False  # set by the CLI's --quiet
_ACTIVE: list = []  # steps of the bars drawn now, innermost last (`tick`)


def enabled() -> bool:
    return not QUIET and sys.stderr.isatty()


@contextlib.contextmanager
def progress(description: str, total: int | None):
    """Yields `step(n=1)`; draws a bar with ETA when `enabled()`, else does nothing."""
    if not enabled():
        yield lambda n=1: None
        return
    if _ACTIVE:  # one bar at a time: an inner long task advances the outer bar
        yield _ACTIVE[-1]
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    cols = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ]
    with Progress(*cols, console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(description, total=total)
        _ACTIVE.append(lambda n=1: bar.advance(task, n))
        try:
            yield _ACTIVE[-1]
        finally:
            _ACTIVE.pop()


def tick(n: int = 1) -> None:
    """Advance the bar drawn now, if any (for work that does not know its caller's bar)."""
    if _ACTIVE:
        _ACTIVE[-1](n)
