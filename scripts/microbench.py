#!/usr/bin/env python3
"""Measure your own GPU's kernels and write them in the layout of ../shared/measurements.

    python scripts/microbench.py OUT.json [--device cuda] [--quick] [--compile] [--queue N] [--only attn,elem]
                                          [--attn-grid wide]

Needs PyTorch (`pip install "paraplan[microbench]"`, or any torch build for your GPU). Measures, with CUDA
events (wall clock on the CPU), the median of --repeats timed runs after --warmup runs, on random data:
- gemm: BF16 `a @ b` (and FP8 `torch._scaled_mm` where the GPU has it) at layer shapes of a few models over
  tp 1..8 and token counts, and squares 256..16384;
- attn: causal `scaled_dot_product_attention` forward and forward+backward over heads x sequence, head_dim 128
  (and 64), with PyTorch's default kernel (`fw_s`, `fwbw_s`) and each fused backend forced (`cudnn`: cuDNN's
  fused attention, Transformer Engine's; `flash2`: FlashAttention-2);
- elem: add, gelu, layer norm, RMS norm and dropout on tokens x hidden tensors, with the bytes each moves;
- layer: whole pre-norm blocks forward + backward, eager (and torch.compile'd with --compile).
`python scripts/bench_kernels.py --measurements OUT.json --system YOUR-SYSTEM` then scores the model against
them, so a system file's efficiencies can be measured rather than guessed. `--device cpu --quick` is a smoke
test of the script itself (tiny shapes; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from torch_timing import median_time, need_torch

SHAPES = {  # model: (hidden, ffn, heads, kv_heads, gated)
    "gpt3-175b": (12288, 49152, 96, 96, False),
    "llama3.1-70b": (8192, 28672, 64, 8, True),
    "llama3.1-8b": (4096, 14336, 32, 8, True),
}


def gemms(torch, dev, quick, timer) -> list[dict]:
    out = []
    dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    cases = []
    for model, (h, f, a, kv, gated) in SHAPES.items():
        qkv = h + 2 * kv * (h // a)
        up = 2 * f if gated else f
        for tp in [1] if quick else [1, 2, 4, 8]:
            for tokens in [64] if quick else [2048, 8192]:
                for op, (m, n, k) in {
                    "qkv": (tokens, qkv // tp, h),
                    "proj": (tokens, h, h // tp),
                    "up": (tokens, up // tp, h),
                    "down": (tokens, h, f // tp),
                }.items():
                    cases.append((model, tp, tokens, op, m, n, k))
        if quick:
            break
    for sq in [64, 128] if quick else [256, 512, 1024, 2048, 4096, 8192, 16384]:
        cases.append(("square", 1, sq, "square", sq, sq, sq))
    fp8 = fp8_gemm(torch, dev)
    for model, tp, tokens, op, m, n, k in cases:
        if quick:
            m, n, k = min(m, 64), min(n, 64), min(k, 64)
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = torch.randn(k, n, device=dev, dtype=dt)
        s = timer(lambda a=a, b=b: a @ b)
        out.append(
            {
                "model": model,
                "tp": tp,
                "tokens": tokens,
                "op": op,
                "m": m,
                "n": n,
                "k": k,
                "dtype": "bf16" if dt == torch.bfloat16 else "fp32",
                "s": s,
                "tflops": 2 * m * n * k / s / 1e12,
            }
        )
        if fp8 is not None and m % 16 == 0 and n % 16 == 0 and k % 16 == 0:
            fn = fp8(a, b)
            s = timer(fn)
            out.append(
                {
                    "model": model,
                    "tp": tp,
                    "tokens": tokens,
                    "op": op,
                    "m": m,
                    "n": n,
                    "k": k,
                    "dtype": "fp8",
                    "s": s,
                    "tflops": 2 * m * n * k / s / 1e12,
                }
            )
        del a, b
    return out


def fp8_gemm(torch, dev):
    """A maker of FP8 GEMMs (`torch._scaled_mm`: e4m3 operands with per-tensor scales, bf16 out; B
    column-major as cuBLASLt wants it), or None where the device has no FP8 tensor cores (compute
    capability < 8.9) or the build lacks it."""
    if not dev.startswith("cuda") or not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return None
    if torch.cuda.get_device_capability(0) < (8, 9):
        return None
    one = torch.ones((), device=dev, dtype=torch.float32)

    def make(a, b):
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
        return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    try:
        x = torch.randn(32, 32, device=dev, dtype=torch.bfloat16)
        make(x, x)()
    except Exception:  # noqa: BLE001 - an FP8 path this build or GPU does not have: BF16 only
        return None
    return make


# --attn-grid wide: heads per GPU from 4 to 96 (tp-sharded models), 1K-16K tokens, micro-batches 1-4, head
# sizes 64 and 128: the tile counts from a fraction of one wave over the SMs to hundreds of waves
WIDE_HEADS = ((4, 4), (8, 1), (12, 12), (16, 16), (32, 8), (48, 48), (64, 8), (96, 96))


def attention(torch, dev, quick, timer, wide=False) -> list[dict]:
    import torch.nn.functional as F

    dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    out = []
    if quick:
        grid = [(1, 128, 2, 2, 32)]
    elif wide:
        grid = [
            (b, s, hh, kv, d)
            for d in (128, 64)
            for s in (1024, 2048, 4096, 8192, 16384)
            for hh, kv in WIDE_HEADS
            for b in (1, 4)
            if b * s <= 16384
        ]
    else:
        grid = (
            [
                (1, s, hh, kv, 128)
                for s in (2048, 4096, 8192)
                for hh, kv in ((96, 96), (64, 8), (32, 8), (12, 12), (8, 1))
            ]
            + [(1, s, 64, 8, 64) for s in (4096, 16384)]
            + [(1, 32768, 8, 1, 128)]
        )
    for b, s, heads, kv, d in grid:
        q = torch.randn(b, heads, s, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(b, kv, s, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(b, kv, s, d, device=dev, dtype=dt, requires_grad=True)
        kw = {"is_causal": True, "enable_gqa": kv != heads}

        def fw(q=q, k=k, v=v, kw=kw):
            return F.scaled_dot_product_attention(q, k, v, **kw)

        def fwbw(fw=fw):
            fw().sum().backward()

        row = {"b": b, "s": s, "heads": heads, "kv_heads": kv, "head_dim": d}
        for name, ctx in backends(torch, dev):
            try:
                with ctx():
                    row[name] = {"fw_s": timer(fw), "fwbw_s": timer(fwbw)}
            except RuntimeError:  # this backend does not take the shape (or is not built): not measured
                continue
        if "default" in row:
            row.update(row["default"])  # fw_s / fwbw_s: PyTorch's own choice, as earlier files have them
            out.append(row)
    return out


def backends(torch, dev):
    """(name, context) for PyTorch's default SDPA choice and, on CUDA, each fused backend forced: `cudnn`
    (cuDNN's fused attention, Transformer Engine's kernels on Hopper/Blackwell) and `flash2` (PyTorch's
    FlashAttention-2)."""
    import contextlib

    out = [("default", contextlib.nullcontext)]
    if dev.startswith("cuda"):
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:
            return out
        for name, be in (("cudnn", "CUDNN_ATTENTION"), ("flash2", "FLASH_ATTENTION")):
            if hasattr(SDPBackend, be):
                out.append((name, lambda be=be: sdpa_kernel(getattr(SDPBackend, be))))
    return out


def elementwise(torch, dev, quick, timer) -> list[dict]:
    dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    e = 2 if dt == torch.bfloat16 else 4
    out = []
    for tokens, hidden in (
        [(64, 128)] if quick else [(512, 1024), (2048, 4096), (8192, 4096), (8192, 8192), (16384, 12288)]
    ):
        x = torch.randn(tokens, hidden, device=dev, dtype=dt)
        y = torch.randn(tokens, hidden, device=dev, dtype=dt)
        ln = torch.nn.LayerNorm(hidden, device=dev, dtype=dt)
        rms = torch.nn.RMSNorm(hidden, device=dev, dtype=dt) if hasattr(torch.nn, "RMSNorm") else ln
        n = tokens * hidden
        ops = {
            "add": (lambda x=x, y=y: x + y, 3 * n * e),
            "gelu": (lambda x=x: torch.nn.functional.gelu(x), 2 * n * e),
            "layernorm": (lambda ln=ln, x=x: ln(x), 2 * n * e),
            "rmsnorm": (lambda rms=rms, x=x: rms(x), 2 * n * e),
            "dropout": (lambda x=x: torch.nn.functional.dropout(x, 0.1, True), 2 * n * e + n),
        }
        res = {}
        for name, (fn, nbytes) in ops.items():
            s = timer(fn)
            res[name] = {"s": s, "bytes": nbytes, "gbps": nbytes / s / 1e9}
        out.append({"tokens": tokens, "hidden": hidden, "ops": res})
    return out


# (model, hidden, ffn, heads, kv_heads, gated, micro_batch, seq, layers): the H100 file's block cases
BLOCKS = [
    ("llama3.1-8b", 4096, 14336, 32, 8, True, 1, 4096, 4),
    ("llama3.1-8b", 4096, 14336, 32, 8, True, 2, 8192, 2),
    ("gpt3-175b", 12288, 49152, 96, 96, False, 1, 2048, 1),
    ("gpt-1.3b", 2048, 8192, 16, 16, False, 4, 2048, 8),
    ("llama3.1-70b", 8192, 28672, 64, 8, True, 1, 4096, 2),
]


def block_case(torch, dev, dt, timer, case: tuple, compile_too: bool) -> list[dict]:
    """One BLOCKS case (model, hidden, ffn, heads, kv_heads, gated, micro_batch, seq, layers) timed forward +
    backward: its row, eager, and with `compile_too` a second row torch.compile'd."""
    import torch.nn.functional as F

    model, h, f, a, kv, gated, b, s, n_layers = case
    rows = []
    d = h // a

    def lin(o, i, bias):
        w = (torch.randn(o, i, device=dev, dtype=dt) * 0.02).requires_grad_()
        return w, (torch.zeros(o, device=dev, dtype=dt, requires_grad=True) if bias else None)

    layers = []
    for _ in range(n_layers):
        norm = [torch.ones(h, device=dev, dtype=dt, requires_grad=True) for _ in range(2)]
        nb = [None if gated else torch.zeros(h, device=dev, dtype=dt, requires_grad=True) for _ in range(2)]
        layers.append(
            {
                "norm": norm,
                "nb": nb,
                "qkv": lin((a + 2 * kv) * d, h, not gated),
                "o": lin(h, a * d, not gated),
                "up": lin(2 * f if gated else f, h, not gated),
                "down": lin(h, f, not gated),
            }
        )
    pos = torch.arange(s, device=dev, dtype=torch.float32)[:, None]
    ang = pos * (1.0 / 500000 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))[None, :]
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)

    def rope(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def norm(x, w, bias):
        return F.rms_norm(x, (h,), w) if gated else F.layer_norm(x, (h,), w, bias)

    def block(x, p):
        y = norm(x, p["norm"][0], p["nb"][0])
        q, k, v = F.linear(y, *p["qkv"]).split([a * d, kv * d, kv * d], dim=-1)
        q = q.view(b, s, a, d).transpose(1, 2)
        k = k.view(b, s, kv, d).transpose(1, 2)
        v = v.view(b, s, kv, d).transpose(1, 2)
        if gated:
            q, k = rope(q), rope(k)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != a)
        x = x + F.linear(o.transpose(1, 2).reshape(b, s, a * d), *p["o"])
        y = F.linear(norm(x, p["norm"][1], p["nb"][1]), *p["up"])
        y = F.silu(y[..., :f]) * y[..., f:] if gated else F.gelu(y)
        return x + F.linear(y, *p["down"])

    x = torch.randn(b, s, h, device=dev, dtype=dt, requires_grad=True)
    for compiled in [False, True] if compile_too else [False]:
        fn = torch.compile(block) if compiled else block

        def fwbw(fn=fn):
            y = x
            for p in layers:
                y = fn(y, p)
            y.sum().backward()

        t = timer(fwbw)
        rows.append(
            {
                "model": model,
                "hidden": h,
                "ffn": f,
                "heads": a,
                "kv_heads": kv,
                "head_dim": d,
                "gated": gated,
                "micro_batch": b,
                "seq": s,
                "layers": n_layers,
                "compiled": compiled,
                "fwbw_s": t,
                "per_layer_s": t / n_layers,
            }
        )
    return rows


def blocks(torch, dev, quick, timer, compile_too=False) -> list[dict]:
    """Whole pre-norm transformer blocks, forward + backward, eager (and torch.compile'd with --compile):
    Llama-style (RMSNorm, rotary embedding, GQA, SwiGLU, no biases) or GPT-style (LayerNorm with biases,
    GELU), bf16, no dropout; `layers` blocks in a row on one micro-batch, per_layer_s = fwbw_s / layers."""
    dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    out = []
    cases = [("tiny", 64, 128, 4, 2, True, 1, 32, 2)] if quick else BLOCKS
    for case in cases:
        out.extend(block_case(torch, dev, dt, timer, case, compile_too))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test of the script")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--compile", action="store_true", help="also time the blocks under torch.compile (slow to start)"
    )
    ap.add_argument(
        "--queue", type=int, default=1, help="calls timed back to back per measurement (default 1)"
    )
    ap.add_argument("--only", default="gemm,attn,elem,layer", help="comma-separated tables to measure")
    ap.add_argument(
        "--attn-grid",
        choices=("standard", "wide"),
        default="standard",
        help="wide: 4-96 heads, 1K-16K tokens, micro-batch 1 and 4, head size 64 and 128",
    )
    a = ap.parse_args()
    torch = need_torch("microbench", gpu=a.device.startswith("cuda"), smoke_flag="--device cpu --quick")
    dev = a.device
    queue = max(1, a.queue)

    def timer(fn) -> float:
        """Median seconds of one `fn()` (`torch_timing.median_time`; --queue calls back to back per
        timed run)."""
        return median_time(torch, fn, a.repeats, a.warmup, queue=queue, cuda=dev.startswith("cuda"))

    only = set(a.only.split(","))
    name = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu"
    sms = torch.cuda.get_device_properties(0).multi_processor_count if dev.startswith("cuda") else None
    cudnn = torch.backends.cudnn.version() if dev.startswith("cuda") else None
    data = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "sms": sms,
        "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "queue": queue,
        "gemm": gemms(torch, dev, a.quick, timer) if "gemm" in only else [],
        "attn": attention(torch, dev, a.quick, timer, a.attn_grid == "wide") if "attn" in only else [],
        "elem": elementwise(torch, dev, a.quick, timer) if "elem" in only else [],
        "layer": blocks(torch, dev, a.quick, timer, a.compile) if "layer" in only else [],
    }
    with open(a.out, "w") as f:
        json.dump(data, f, indent=1)
    print(
        f"wrote {a.out}: {len(data['gemm'])} GEMMs, {len(data['attn'])} attention, "
        f"{len(data['elem'])} element-wise "
        f"sizes, {len(data['layer'])} blocks on {name}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
