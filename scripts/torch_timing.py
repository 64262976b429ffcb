"""What the GPU measurement scripts (microbench.py, microbench_moe_layer.py, microbench_ring_attention.py)
share: PyTorch or a clear exit, and one way of timing a call."""

from __future__ import annotations

import statistics
import sys
import time


def need_torch(script: str, gpu: bool, smoke_flag: str | None):
    """PyTorch, or exit 2 with what to install; with `gpu`, exit 2 where CUDA is absent, naming the script's
    smoke test flag (`smoke_flag`) that runs anywhere, if it has one."""
    try:
        import torch
    except ImportError:
        print(
            f"{script} needs PyTorch: pip install 'paraplan[microbench]' (or a torch build for your GPU)",
            file=sys.stderr,
        )
        sys.exit(2)
    if gpu and not torch.cuda.is_available():
        print(
            "no CUDA device: run on a GPU machine"
            + (f", or {smoke_flag} to test the script" if smoke_flag else ""),
            file=sys.stderr,
        )
        sys.exit(2)
    return torch


def median_time(torch, fn, repeats: int, warmup: int, queue: int = 1, cuda: bool | None = None) -> float:
    """Median seconds of one `fn()` over `repeats` timed runs after `warmup` calls: CUDA events on a GPU (the
    wall clock on a CPU). With `queue` > 1 each timed run is `queue` calls back to back, divided by `queue`:
    the GPU then runs them as a training step does, queued ahead by the CPU, so the CPU's dispatch time is
    hidden unless it is longer than the kernels; with 1 each call's dispatch on an idle GPU is inside its
    time. `cuda`: time with CUDA events (default: where CUDA is available)."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(queue):
                fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3 / queue)
        else:
            t0 = time.perf_counter()
            for _ in range(queue):
                fn()
            times.append((time.perf_counter() - t0) / queue)
    return statistics.median(times)


def wall_time(torch, fn, repeats: int, warmup: int) -> float:
    """Mean wall-clock seconds of `fn()` over `repeats` back-to-back calls, synchronised at both ends: what
    the host sees, CPU time between kernels included."""
    for _ in range(warmup):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats
