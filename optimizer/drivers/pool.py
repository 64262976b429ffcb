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
import threading
import time
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
    return ProcessPoolExecutor(
        max_workers=max_workers, mp_context=ctx, initializer=die_with_parent, initargs=(os.getpid(),)
    )


def die_with_parent(main_pid: int, poll_s: float = 1.0) -> None:
    """Worker initializer: end this worker when the process that started it ends, even by SIGKILL (an OOM
    kill, a scheduler signalling only the main pid), rather than wait for work for ever as an orphan. That
    process is the main process `main_pid` (fork, spawn) or the forkserver. A daemon thread exits the
    worker within `poll_s` s once its parent is no longer its parent or the main process is gone (a
    forkserver outlives the main process). Not prctl(PR_SET_PDEATHSIG): that fires when the forking thread
    ends, which may be any thread of a program that uses the API."""
    parent = os.getppid()
    if parent == 1 and main_pid != 1:  # orphaned before it started
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent and _exists(main_pid):
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="paraplan-parent-watch", daemon=True).start()


def _exists(pid: int) -> bool:
    """Whether a process `pid` exists (signal 0: nothing is sent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
