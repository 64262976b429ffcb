#!/usr/bin/env python3
"""Time the element-wise passes Megatron-Core's eager expert MLP adds for GPT-OSS: the clamped GLU's clamps
and concatenation, and the probability-scaled expert biases, forward and backward.

    python scripts/microbench_expert_eager.py OUT.json [--small]

Megatron-Core's TEGroupedMLP without Transformer Engine's op fuser (core_v0.15-0.18) clamps the two halves of
the experts' up-projection output and concatenates them before its fused activation kernel
(fused_bias_geglu.weighted_bias_quick_geglu_impl with activation_func_clamp_value), and adds the
down-projection's bias, scaled by each row's routing probability, expert by expert after the grouped GEMM
(TEGroupedMLP._apply_bias: split the rows by expert, t + b * p, concatenate). This script runs the same tensor
operations in eager PyTorch with autograd (bf16, random data, the GPT-OSS-120B widths: up-projection 2 x 2880,
hidden 2880) at the rows and local experts of the published runs' ranks (16384 rows over 16 experts: H100, ep
8, micro-batch 1; 65536 over 2: GB200, ep 64, micro-batch 4; 65536 over 16: B200, ep 8, micro-batch 4) and
times each forward and forward+backward with CUDA events (median of --repeats after warm-up).
`bench_kernels.py --measurements OUT.json --system SYSTEM` (class `expert_eager`) scores the model's
`layer.block_cost` increments (`llm.activation_clamp`, `moe.expert_bias`) against them. `--small`: tiny shapes
on any device (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import sys

from torch_timing import median_time, need_torch

UP, HIDDEN, CLAMP = 2 * 2880, 2880, 7.0
CASES = ((16384, 16), (65536, 2), (65536, 16))  # (rows of the rank, local experts)


def time_case(torch, timer, rows: int, experts: int, up: int, hidden: int, dev: str, dt) -> dict:
    """The row of one case: `timer`'s seconds for the clamped GLU's clamps on `rows` x `up` and the
    expert-bias add with probability weighting on `rows` x `hidden` over `experts` local experts, forward and
    forward+backward."""
    x = torch.randn(rows, up, device=dev, dtype=dt, requires_grad=True)
    g_up = torch.randn(rows, up, device=dev, dtype=dt)

    def clamp_fw():
        a, b = x.chunk(2, -1)
        return torch.cat((a.clamp(max=CLAMP), b.clamp(min=-CLAMP, max=CLAMP)), -1)

    # the gradient handed on (to the up-projection's backward), not accumulated in .grad
    def clamp_fwbw():
        torch.autograd.grad(clamp_fw(), [x], g_up)

    t = torch.randn(rows, hidden, device=dev, dtype=dt, requires_grad=True)
    p = torch.rand(rows, 1, device=dev, dtype=dt, requires_grad=True)
    bias = [torch.randn(hidden, device=dev, dtype=dt, requires_grad=True) for _ in range(experts)]
    split = [rows // experts] * experts
    g_h = torch.randn(rows, hidden, device=dev, dtype=dt)

    def bias_fw():
        return torch.cat(
            [
                tt + bb * pp
                for tt, bb, pp in zip(torch.split(t, split), bias, torch.split(p, split), strict=True)
            ]
        ).to(dt)

    def bias_fwbw():
        torch.autograd.grad(bias_fw(), [t, p, *bias], g_h)

    return {
        "rows": rows,
        "experts": experts,
        "clamp": {"fw_s": timer(clamp_fw), "fwbw_s": timer(clamp_fwbw)},
        "bias": {"fw_s": timer(bias_fw), "fwbw_s": timer(bias_fwbw)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--small", action="store_true", help="tiny shapes on any device: a smoke test")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    torch = need_torch("microbench_expert_eager", gpu=not args.small, smoke_flag="--small")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    up, hidden = (64, 32) if args.small else (UP, HIDDEN)
    cases = ((256, 4), (512, 2)) if args.small else CASES
    res = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "torch": torch.__version__,
        "up": up,
        "hidden": hidden,
        "dtype": str(dt).replace("torch.", ""),
        "rows": [],
    }

    def timer(fn):
        return median_time(torch, fn, args.repeats, args.warmup)

    for rows, experts in cases:
        res["rows"].append(time_case(torch, timer, rows, experts, up, hidden, dev, dt))
        print(res["rows"][-1], flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
