"""Worker processes for independent solves (study points, procurement node types).

Workers start from a fork server, never by forking the caller: the caller has usually run CP-SAT already, and a
child forked from a process whose solver threads held locks can die or hang (a `BrokenProcessPool` seen in the
test suite). The fork server is a fresh interpreter that has imported the solver once, so each worker starts in
milliseconds with the modules loaded.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

_PRELOAD = ["optimizer.study", "optimizer.procure", "formulations.tables"]


def process_pool(max_workers: int) -> ProcessPoolExecutor:
    """A process pool of `max_workers` workers started from the fork server (spawn where there is none)."""
    try:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
    except ValueError:  # platforms without a fork server (Windows)
        ctx = mp.get_context("spawn")
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=ctx)
