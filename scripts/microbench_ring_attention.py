#!/usr/bin/env python3
"""Time one rank's share of load-balanced ring attention (context parallelism) on one GPU, without the ring.

    python scripts/microbench_ring_attention.py OUT.json [--small]

PyTorch's context parallelism (torch.distributed.tensor.experimental.context_parallel, the one torchtitan
runs; Transformer Engine's p2p ring is built the same way) splits the sequence into 2*cp chunks, gives rank r
chunks r and 2cp-1-r, and runs cp steps: step 0 causal attention of the local queries on the local keys; each
later step one full (non-causal) kernel, either all local queries against the first half of the received K/V
chunk (steps i <= r) or the second half of the queries against all of it (i > r); the partial outputs are
merged in fp32 with their log-sum-exps
(out -= sigmoid(lse_i - lse) * (out - out_i); lse -= logsigmoid(lse - lse_i)), and backward runs the same
kernels in reverse. This times exactly that computation on one GPU (the K/V of the other ranks are random
tensors already here: no communication), forward and forward+backward, for the torchtitan runs' shapes (Llama
3.1 8B: 32 query / 8 K/V heads of 128; 32768 tokens per rank at cp 1, 2, 4 and 8, i.e. sequences of 32K-256K;
K/V expanded to the 32 query heads, as the kernels called here take equal heads), with PyTorch's
FlashAttention-2 kernel (as those runs) and cuDNN's where it takes the shape. `scripts/bench_kernels.py` is
not needed: compare `fwbw_s` with the model's `optimizer.model.layer.flash_attention(..., cp=cp)` for the same
shapes. `--small`: tiny shapes on any device.
"""

import argparse
import json
import sys

from torch_timing import median_time, need_torch


def attn_lse(q, k, v, causal, backend):
    """Attention output and log-sum-exp ([b, h, s]) with autograd, on the chosen kernel (`math`: plain PyTorch
    in fp32, any device)."""
    import torch

    if backend == "flash2":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[:2]
        return out, lse
    if backend == "cudnn":
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal, False
        )[:2]
        return out, lse.reshape(out.shape[:3])
    s = (q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return (torch.softmax(s, dim=-1) @ v.float()).to(q.dtype), lse


def ring_rank(q, ks, vs, cp, rank, backend):
    """Rank `rank`'s forward over the cp steps (`ks[i]`, `vs[i]`: the K/V chunk pair it holds at step i, its
    own at step 0) with the fp32 merges, as torch's _templated_ring_attention / _SDPAMerger."""
    import torch
    import torch.nn.functional as F

    out = lse = None
    half = q.shape[2] // 2
    for i in range(cp):
        k, v = ks[i], vs[i]
        if i == 0:
            o, l_, partial = *attn_lse(q, k, v, True, backend), False
        elif i <= rank:
            kh, vh = k[:, :, : k.shape[2] // 2], v[:, :, : v.shape[2] // 2]
            o, l_, partial = *attn_lse(q, kh, vh, False, backend), False
        else:
            o, l_, partial = *attn_lse(q[:, :, half:], k, v, False, backend), True
        o, l_ = o.float(), l_.float().unsqueeze(-1)
        if out is None:
            out, lse = o, l_
        elif not partial:
            out = out - torch.sigmoid(l_ - lse) * (out - o)
            lse = lse - F.logsigmoid(lse - l_)
        else:
            o2, l2 = out[:, :, half:], lse[:, :, half:]
            o2 = o2 - torch.sigmoid(l_ - l2) * (o2 - o)
            l2 = l2 - F.logsigmoid(l2 - l_)
            out = torch.cat([out[:, :, :half], o2], dim=2)
            lse = torch.cat([lse[:, :, :half], l2], dim=2)
    return out.to(q.dtype)


def local_chunks(x, cp, rank):
    """The load-balanced layout: of 2*cp sequence chunks (dim 2), rank r holds chunks r and 2cp-1-r."""
    import torch

    c = x.chunk(2 * cp, dim=2)
    return torch.cat([c[rank], c[2 * cp - 1 - rank]], dim=2)


def ring_exact(q, k, v, cp, rank, backend="math"):
    """Rank `rank`'s ring output for full-sequence q, k, v, with the chunk pair of rank (rank - i) mod cp at
    step i (the ring passes K/V to the next rank): equal to the causal attention of the whole sequence on that
    rank's chunks (the smoke test checks it)."""
    ks = [local_chunks(k, cp, (rank - i) % cp) for i in range(cp)]
    vs = [local_chunks(v, cp, (rank - i) % cp) for i in range(cp)]
    return ring_rank(local_chunks(q, cp, rank), ks, vs, cp, rank, backend)


def time_rank(
    torch, row: dict, q, ks, vs, cp: int, rank: int, local: int, backend: str, repeats: int
) -> None:
    """Set `row`'s `fw_s`, `fwbw_s` and `kernels_fw_s`: median seconds over `repeats` runs of rank `rank`'s
    ring forward, forward+backward, and the same steps' attention calls alone (forward, no merges), for
    queries `q` of `local` tokens and the K/V chunk pairs `ks`, `vs` of its cp steps."""
    go = torch.randn(*q.shape, device=q.device, dtype=q.dtype)
    row["fw_s"] = median_time(torch, lambda: ring_rank(q, ks, vs, cp, rank, backend), repeats, 2)

    def fb():
        ring_rank(q, ks, vs, cp, rank, backend).backward(go)

    row["fwbw_s"] = median_time(torch, fb, repeats, 2)

    def kernels():  # the same steps' attention calls alone, forward, no merges
        with torch.no_grad():
            for i in range(cp):
                if i == 0:
                    attn_lse(q, ks[i], vs[i], True, backend)
                elif i <= rank:
                    attn_lse(q, ks[i][:, :, : local // 2], vs[i][:, :, : local // 2], False, backend)
                else:
                    attn_lse(q[:, :, local // 2 :], ks[i], vs[i], False, backend)

    row["kernels_fw_s"] = median_time(torch, kernels, repeats, 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--small", action="store_true", help="tiny shapes on any device: a smoke test")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch = need_torch("microbench_ring_attention", gpu=not a.small, smoke_flag="--small")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    res = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": [],
        "errors": [],
    }
    heads, kvh, d = (32, 8, 128) if not a.small else (4, 1, 32)
    local = 32768 if not a.small else 256
    for backend in ["flash2", "cudnn"] if dev == "cuda" else ["math"]:
        for cp in (1, 2, 4, 8):
            rank = cp - 1  # load-balanced: every rank has the same work; the last one runs the partial merges
            q = torch.randn(1, heads, local, d, device=dev, dtype=dt, requires_grad=True)
            ks = [
                torch.randn(1, heads, local, d, device=dev, dtype=dt, requires_grad=True) for _ in range(cp)
            ]
            vs = [
                torch.randn(1, heads, local, d, device=dev, dtype=dt, requires_grad=True) for _ in range(cp)
            ]
            row = {
                "backend": backend,
                "cp": cp,
                "rank": rank,
                "tokens_per_rank": local,
                "seq": local * cp,
                "heads": heads,
                "kv_heads": kvh,
                "head_dim": d,
            }
            try:
                time_rank(torch, row, q, ks, vs, cp, rank, local, backend, a.repeats)
                res["rows"].append(row)
            except Exception as ex:  # noqa: BLE001 - a backend that does not take the shape: recorded, not fatal
                res["errors"].append(f"{backend} cp{cp}: {ex!r}"[:300])
            del q, ks, vs
            if dev == "cuda":
                torch.cuda.empty_cache()
            with open(a.out, "w") as fh:
                json.dump(res, fh, indent=1)
    print(
        f"wrote {a.out}: "
        + ", ".join(f"{r['backend']} cp{r['cp']} {r['fwbw_s'] * 1e3:.1f} ms" for r in res["rows"])
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
