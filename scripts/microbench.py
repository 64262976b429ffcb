#!/usr/bin/env python3
"""Measure your own GPU's kernels and write them in the layout of ../shared/measurements (issue 15).

    python scripts/microbench.py OUT.json [--device cuda] [--quick]

Needs PyTorch (`pip install "paraplan[microbench]"`, or any torch build for your GPU). Measures, with CUDA events
(wall clock on the CPU), the median of --repeats timed runs after --warmup runs, on random data:
- gemm: BF16 `a @ b` (and FP8 `torch._scaled_mm` where the GPU has it) at layer shapes of a few models over
  tp 1..8 and token counts, and squares 256..16384;
- attn: causal `scaled_dot_product_attention` forward and forward+backward over heads x sequence, head_dim 128;
- elem: add, gelu, layer norm, RMS norm and dropout on tokens x hidden tensors, with the bytes each moves.
`python scripts/bench_kernels.py --measurements OUT.json --system YOUR-SYSTEM` then scores the model against
them, so a system file's efficiencies can be measured rather than guessed. `--device cpu --quick` is a smoke
test of the script itself (tiny shapes; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SHAPES = {  # model: (hidden, ffn, heads, kv_heads, gated)
    "gpt3-175b": (12288, 49152, 96, 96, False),
    "llama3.1-70b": (8192, 28672, 64, 8, True),
    "llama3.1-8b": (4096, 14336, 32, 8, True),
}


def timer(torch, device: str, fn, warmup: int, repeats: int) -> float:
    """Median seconds of `fn()`."""
    for _ in range(warmup):
        fn()
    times = []
    if device.startswith("cuda"):
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemms(torch, dev, quick, warmup, repeats) -> list[dict]:
    out = []
    dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    cases = []
    for model, (h, f, a, kv, gated) in SHAPES.items():
        qkv = h + 2 * kv * (h // a)
        up = 2 * f if gated else f
        for tp in ([1] if quick else [1, 2, 4, 8]):
            for tokens in ([64] if quick else [2048, 8192]):
                for op, (m, n, k) in {"qkv": (tokens, qkv // tp, h), "proj": (tokens, h, h // tp),
                                      "up": (tokens, up // tp, h), "down": (tokens, h, f // tp)}.items():
                    cases.append((model, tp, tokens, op, m, n, k))
        if quick:
            break
    for sq in ([64, 128] if quick else [256, 512, 1024, 2048, 4096, 8192, 16384]):
        cases.append(("square", 1, sq, "square", sq, sq, sq))
    for model, tp, tokens, op, m, n, k in cases:
        if quick:
            m, n, k = min(m, 64), min(n, 64), min(k, 64)
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = torch.randn(k, n, device=dev, dtype=dt)
        s = timer(torch, dev, lambda: a @ b, warmup, repeats)
        out.append({"model": model, "tp": tp, "tokens": tokens, "op": op, "m": m, "n": n, "k": k,
                    "dtype": "bf16" if dt == torch.bfloat16 else "fp32", "s": s, "tflops": 2 * m * n * k / s / 1e12})
    return out


def attention(torch, dev, quick, warmup, repeats) -> list[dict]:
    import torch.nn.functional as F

    dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    out = []
    grid = [(1, 128, 2, 2)] if quick else [(1, s, hh, kv) for s in (2048, 4096, 8192) for hh, kv in
                                           ((96, 96), (64, 8), (32, 8), (12, 12), (8, 1))]
    d = 32 if quick else 128
    for b, s, heads, kv in grid:
        q = torch.randn(b, heads, s, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(b, kv, s, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(b, kv, s, d, device=dev, dtype=dt, requires_grad=True)
        kw = {"is_causal": True, "enable_gqa": kv != heads}

        def fw():
            return F.scaled_dot_product_attention(q, k, v, **kw)

        def fwbw():
            fw().sum().backward()

        out.append({"b": b, "s": s, "heads": heads, "kv_heads": kv, "head_dim": d,
                    "fw_s": timer(torch, dev, fw, warmup, repeats), "fwbw_s": timer(torch, dev, fwbw, warmup, repeats)})
    return out


def elementwise(torch, dev, quick, warmup, repeats) -> list[dict]:
    dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    e = 2 if dt == torch.bfloat16 else 4
    out = []
    for tokens, hidden in ([(64, 128)] if quick else [(512, 1024), (2048, 4096), (8192, 4096), (8192, 8192),
                                                         (16384, 12288)]):
        x = torch.randn(tokens, hidden, device=dev, dtype=dt)
        y = torch.randn(tokens, hidden, device=dev, dtype=dt)
        ln = torch.nn.LayerNorm(hidden, device=dev, dtype=dt)
        rms = torch.nn.RMSNorm(hidden, device=dev, dtype=dt) if hasattr(torch.nn, "RMSNorm") else ln
        n = tokens * hidden
        ops = {"add": (lambda: x + y, 3 * n * e), "gelu": (lambda: torch.nn.functional.gelu(x), 2 * n * e),
               "layernorm": (lambda: ln(x), 2 * n * e), "rmsnorm": (lambda: rms(x), 2 * n * e),
               "dropout": (lambda: torch.nn.functional.dropout(x, 0.1, True), 2 * n * e + n)}
        res = {}
        for name, (fn, nbytes) in ops.items():
            s = timer(torch, dev, fn, warmup, repeats)
            res[name] = {"s": s, "bytes": nbytes, "gbps": nbytes / s / 1e9}
        out.append({"tokens": tokens, "hidden": hidden, "ops": res})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test of the script")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("microbench needs PyTorch: pip install 'paraplan[microbench]' (or a torch build for your GPU)",
              file=sys.stderr)
        return 2
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or --device cpu --quick to test the script", file=sys.stderr)
        return 2
    dev = a.device
    name = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu"
    sms = torch.cuda.get_device_properties(0).multi_processor_count if dev.startswith("cuda") else None
    data = {"device": name, "torch": torch.__version__, "sms": sms,
            "gemm": gemms(torch, dev, a.quick, a.warmup, a.repeats),
            "attn": attention(torch, dev, a.quick, a.warmup, a.repeats),
            "elem": elementwise(torch, dev, a.quick, a.warmup, a.repeats), "layer": []}
    with open(a.out, "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {a.out}: {len(data['gemm'])} GEMMs, {len(data['attn'])} attention, {len(data['elem'])} element-wise "
          f"sizes on {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
