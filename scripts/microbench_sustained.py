#!/usr/bin/env python3
"""Measure a GPU's matrix rate and clocks under sustained load, as a training step holds it, against a burst.

    python scripts/microbench_sustained.py OUT.json [--seconds 30] [--add-mib 1024] [--small]
    python scripts/microbench_sustained.py --compare PART.json REFERENCE.json [PART.json REFERENCE.json ...]

Needs PyTorch on a CUDA GPU (and reads clocks, power and temperature through NVML, `nvidia-ml-py`, where
installed). A microbenchmark's burst (the median of 10 calls after 3 warm-ups, microbench.py) runs at the
boost clock; a training step keeps the tensor cores busy for seconds, and a part held at its power limit
lowers its clock. This script runs, for --seconds each:
- `gemm`: one layer-sized GEMM (8192 tokens x 7168 x 8192: Llama 3.1 70B's gated up-projection at tp 8,
  0.96 TFLOP) back to back, BF16 and FP8 (`torch._scaled_mm`, per-tensor scales, bf16 out);
- `mix`: the same GEMM, each followed by one HBM-bound element-wise add over --add-mib MiB operands (on an
  H100/H200, 1 GiB: 0.35-0.60 of the time; 256 MiB: 0.12-0.26), as a step's norms, activations and casts
  stream memory between its GEMMs. The work per GEMM is the same on every part, so two parts compare at
  equal work.
The bursts (the median of 10 calls after 3 warm-ups) are all taken first, on a cool GPU. Each run is cut into
windows of about 0.25 s, timed with CUDA events per GEMM and per add, with the SM and memory clocks, board
power and temperature read while the window's last kernels still run (the CPU is ahead of the GPU), so the
clocks are those under load. `steady` is the median over the windows after the first quarter of the run.
Two parts compare by the ratio of their steady rates at the same shapes (`--compare`, which needs no GPU):
the geometric mean of the `mix` ratios over dtypes and add sizes is the sustained clock a system file that
transfers the reference part's fitted tables states (`clock_scale`), since a training step interleaves its
GEMMs with memory-bound kernels as `mix` does. One machine per part per pair leaves the machines' own spread
(1-2.5% between two pairs here) in the ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

from torch_timing import median_time, need_torch

GEMM = (8192, 7168, 8192)  # m, n, k


def nvml():
    """A reader of (sm MHz, memory MHz, power W, temperature C, throttle reasons bitmask) for GPU 0, or None
    where NVML is not installed."""
    try:
        import pynvml
    except ImportError:
        return None, {}
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)

    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )

    def read():
        row = {
            "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
            "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        }
        if reasons is not None:
            row["clock_event_reasons"] = int(reasons(h))
        return row

    info = {
        "name": pynvml.nvmlDeviceGetName(h),
        "uuid": pynvml.nvmlDeviceGetUUID(h),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "power_limit_w": pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1e3,
        "max_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
        "max_mem_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
        "idle": read(),
    }
    return read, info


def makers(torch, small: bool, add_mib: int):
    """{dtype: a zero-argument GEMM call} (FP8 where the GPU and build have it) and the element-wise add."""
    m, n, k = (512, 512, 512) if small else GEMM
    dev = "cuda"
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    calls = {"bf16": lambda: a @ b}
    if hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(0) >= (8, 9):
        one = torch.ones((), device=dev, dtype=torch.float32)
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
        calls["fp8"] = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    elems = (1 << 20) if small else add_mib * (1 << 19)  # bf16 elements of add_mib MiB
    x = torch.randn(elems, device=dev, dtype=torch.bfloat16)
    y = torch.randn(elems, device=dev, dtype=torch.bfloat16)
    z = torch.empty_like(x)
    add = lambda: torch.add(x, y, out=z)  # noqa: E731 - reads 2, writes 1 operand
    return calls, add, 2.0 * m * n * k, 3 * elems * 2


def sustained(torch, gemm, add, adds_per_gemm: int, gemms_per_window: int, seconds: float, read) -> list:
    """Windows of `gemms_per_window` GEMMs (each followed by `adds_per_gemm` adds) run back to back for
    `seconds`: each window's GEMM-only and add-only seconds from CUDA events, and NVML's reading at its
    end."""
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    out = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        marks = []
        reading = None
        for i in range(gemms_per_window):
            if read and i == gemms_per_window - 1:
                reading = read()  # the GPU is still busy with the queued kernels: clocks under load
            e0, e1 = ev(), ev()
            e0.record()
            gemm()
            e1.record()
            f1 = e1
            for _ in range(adds_per_gemm):
                add()
            if adds_per_gemm:
                f1 = ev()
                f1.record()
            marks.append((e0, e1, f1))
        torch.cuda.synchronize()
        g = sum(e0.elapsed_time(e1) for e0, e1, _ in marks) / 1e3
        w = sum(e1.elapsed_time(f1) for _, e1, f1 in marks) / 1e3
        row = {"t_s": round(time.perf_counter() - t0, 3), "gemm_s": g, "add_s": w, "n": gemms_per_window}
        if reading:
            row.update(reading)
        out.append(row)
    return out


def summary(rows: list, flops: float, add_bytes: float, adds: int) -> dict:
    """Steady rates (the median over windows after the first quarter of the run) and the clocks then."""
    steady = rows[len(rows) // 4 :] or rows
    tf = [r["n"] * flops / r["gemm_s"] / 1e12 for r in steady]
    out = {
        "steady_tflops": statistics.median(tf),
        "first_window_tflops": rows[0]["n"] * flops / rows[0]["gemm_s"] / 1e12,
    }
    if adds:
        out["steady_add_gbps"] = statistics.median(
            r["n"] * adds * add_bytes / r["add_s"] / 1e9 for r in steady
        )
    for key in ("sm_mhz", "mem_mhz", "power_w", "temp_c"):
        if key in steady[0]:
            out[f"steady_{key}"] = statistics.median(r[key] for r in steady)
    return out


RUN_KEYS = ("dtype", "kind", "adds_per_gemm", "steady_tflops")


def _check_doc(doc) -> None:
    """ValueError unless `doc` is this script's output (the keys `compare` reads)."""
    if not isinstance(doc, dict) or not all(k in doc for k in ("gemm_mnk", "add_bytes", "runs")):
        raise ValueError("not a microbench_sustained.py output (needs gemm_mnk, add_bytes, runs)")
    for run in doc["runs"]:
        missing = [k for k in RUN_KEYS if not isinstance(run, dict) or k not in run]
        if missing:
            raise ValueError(f"a run lacks {', '.join(missing)}")


def compare(part: dict, ref: dict) -> dict:
    """{(dtype, kind): steady GEMM rate of `part` / `reference`} over the runs both measured at the same GEMM
    shape and adds per GEMM. Refuses two GEMM shapes, two add sizes or two power limits (where both files
    record one), and a pair with no `mix` run measured alike."""
    _check_doc(part)
    _check_doc(ref)
    limits = [d.get("nvml", {}).get("power_limit_w") for d in (part, ref)]
    if None not in limits and limits[0] != limits[1]:
        raise ValueError(f"different power limits: {limits[0]} and {limits[1]} W")
    if part["gemm_mnk"] != ref["gemm_mnk"]:
        raise ValueError(f"different GEMM shapes: {part['gemm_mnk']} and {ref['gemm_mnk']}")
    if part["add_bytes"] != ref["add_bytes"]:
        raise ValueError(f"different add sizes: {part['add_bytes']} and {ref['add_bytes']} bytes")
    rates = {(r["dtype"], r["kind"], r["adds_per_gemm"]): r["steady_tflops"] for r in ref["runs"]}
    out = {}
    for r in part["runs"]:
        key = (r["dtype"], r["kind"], r["adds_per_gemm"])
        if key in rates:
            out[(r["dtype"], r["kind"])] = r["steady_tflops"] / rates[key]
    if not any(kind == "mix" for _, kind in out):
        raise ValueError("no `mix` run measured alike on both parts")
    return out


def clock_scale(pairs: list[tuple[dict, dict]]) -> float:
    """The sustained clock of a part against a reference whose fitted tables it takes: the geometric mean of
    the `mix` ratios (`compare`) over every (part, reference) pair, e.g. one per add size, so that the
    memory's share of a step's time is spanned rather than one value of it chosen."""
    mix = []
    for part, ref in pairs:
        mix += [v for (_, kind), v in compare(part, ref).items() if kind == "mix"]
    return math.prod(mix) ** (1.0 / len(mix))


def compare_main(paths: list[str]) -> int:
    """`--compare PART REFERENCE [PART REFERENCE ...]`: each pair's ratios and the clock_scale of them all."""
    if not paths or len(paths) % 2:
        print("usage: microbench_sustained.py --compare PART.json REFERENCE.json [...]", file=sys.stderr)
        return 2
    docs = []
    for path in paths:
        try:
            with open(path) as f:
                docs.append(json.load(f))
            _check_doc(docs[-1])
        except (OSError, ValueError) as e:
            print(f"microbench_sustained: {path}: {e}", file=sys.stderr)
            return 2
    pairs = list(zip(docs[::2], docs[1::2], strict=True))
    try:
        for part, ref in pairs:
            ratios = compare(part, ref)
            mib = part["add_bytes"] / 3 / 2**20
            print(
                f"{part.get('device')} against {ref.get('device')}, adds of {mib:.0f} MiB, steady GEMM rate:"
            )
            for (dtype, kind), v in ratios.items():
                print(f"  {dtype} {kind}: {v:.3f}")
            alone = sorted({(r["dtype"], r["kind"]) for r in part["runs"] + ref["runs"]} - set(ratios))
            if alone:
                print("  skipped, measured on one part only: " + ", ".join(f"{d} {k}" for d, k in alone))
        scale = clock_scale(pairs)
    except ValueError as e:
        print(f"microbench_sustained: {e}", file=sys.stderr)
        return 2
    print(f"clock_scale (geometric mean of the mix ratios): {scale:.3f}")
    return 0


def _positive(kind):
    """An argparse type: `kind` of the value, refused (exit 2) unless above 0."""

    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--compare":
        return compare_main(sys.argv[2:])
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="--compare PART.json REFERENCE.json [...] (as the first argument, no GPU needed): each pair's "
        "steady-rate ratios and the clock_scale of them all.",
    )
    ap.add_argument("out")
    ap.add_argument(
        "--seconds", type=_positive(float), default=30.0, help="seconds of each sustained run (default 30)"
    )
    ap.add_argument(
        "--add-mib", type=_positive(int), default=1024, help="MiB per operand of the mix's add (1024)"
    )
    ap.add_argument("--small", action="store_true", help="tiny shapes and 2 s runs: a smoke test")
    a = ap.parse_args()
    torch = need_torch("microbench_sustained", gpu=True, smoke_flag=None)
    seconds = 2.0 if a.small else a.seconds
    read, info = nvml()
    calls, add, flops, add_bytes = makers(torch, a.small, a.add_mib)
    t_add = median_time(torch, add, 10, 3)
    bursts = {dtype: median_time(torch, gemm, 10, 3) for dtype, gemm in calls.items()}  # on a cool GPU
    data = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv[1:],
        "nvml": info,
        "gemm_mnk": [512, 512, 512] if a.small else list(GEMM),
        "add_bytes": add_bytes,
        "add_burst_gbps": add_bytes / t_add / 1e9,
        "runs": [],
    }
    for dtype, gemm in calls.items():
        t_g = bursts[dtype]
        per_window = max(1, round(0.25 / t_g))
        for kind, n_add in (("gemm", 0), ("mix", 1)):
            rows = sustained(torch, gemm, add, n_add, per_window, seconds, read)
            run = {"dtype": dtype, "kind": kind, "adds_per_gemm": n_add, "burst_tflops": flops / t_g / 1e12}
            run.update(summary(rows, flops, add_bytes, n_add))
            run["windows"] = rows
            data["runs"].append(run)
            print(
                f"{dtype} {kind}: burst {run['burst_tflops']:.0f} TF/s, "
                f"steady {run['steady_tflops']:.0f} TF/s"
                + (f" at {run['steady_sm_mhz']:.0f} MHz, {run['steady_power_w']:.0f} W" if read else ""),
                flush=True,
            )
    with open(a.out, "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {a.out}: {len(data['runs'])} sustained runs on {data['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
