"""Worker processes for independent solves (study points, procurement node types): the one place that starts
them.

Workers are forked (Linux's default up to Python 3.13), so a plain script that calls `procure` or `run_study`
without an ``if __name__ == "__main__":`` guard works; PARAPLAN_MP_START=forkserver (or spawn) starts them
from a fresh interpreter instead, the default of Python 3.14, for hosts where forking a process that already
ran CP-SAT's threads is unwelcome (such scripts then need the guard).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

_PRELOAD = ["optimizer.drivers.study", "optimizer.drivers.procure", "formulations.tables"]


def process_pool(max_workers: int) -> ProcessPoolExecutor:
    """A process pool of `max_workers` workers started by PARAPLAN_MP_START (fork, forkserver, spawn;
    default: fork where the platform has it, else spawn)."""
    method = os.environ.get("PARAPLAN_MP_START") or (
        "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    )
    if method not in mp.get_all_start_methods():
        from optimizer.errors import ParaplanError

        raise ParaplanError(
            f"PARAPLAN_MP_START={method!r}: this platform starts processes by "
            f"{', '.join(mp.get_all_start_methods())}"
        )
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=ctx)
