#!/usr/bin/env python3
"""Time one GPT-OSS-120B block on one GPU in plain eager PyTorch (bf16), and the kernels inside it.

    python scripts/microbench_moe_layer.py OUT.json [--small]

What the published Megatron-Bridge GPT-OSS runs leave unexplained (the model is 25-35% fast on all five GPU
types) is either kernel time the model does not price or time outside the kernels. This measures the kernels
of one block with the shapes of the H100 run's rank (tp 1, ep 8: 16 local experts, one 4096-token micro-batch,
force-balanced routing as in the runs, so 1024 rows per expert; no all-to-all, as if every routed row stayed
local; full causal attention in every layer, no sinks):
- gemm: the block's dense GEMMs and an expert's GEMMs at 1024 / 4096 / 32768 rows;
- grouped: the experts' up and down projections as one batched GEMM (`torch.bmm`), a loop of GEMMs and
  `torch._grouped_mm`, for 16 x 1024, 16 x 4096, 2 x 32768 and 4 x 8192 rows;
- layer: the attention half, the MoE half and the whole block forward and forward+backward (RMSNorm, QKV with
  bias, rotary, SDPA, output projection with bias; router, top-4, softmax, permute, expert up with bias,
  clamped SwiGLU with the +1 offset, expert down with bias, probability-weighted combine), with and without
  the host synchronisation a dropless dispatcher makes (token counts to the CPU), one block and nine in a row
  (a PP stage of the H100 run), and the CUDA time of the top kernels (`profile_top`: name, seconds per block,
  calls).
Attention kernels per backend and head size are microbench.py's (`--attn-grid wide`), context parallelism's
steps microbench_ring_attention.py's. `--small` shrinks every shape (a CPU smoke test; the numbers mean
nothing). Output in problems/measurements/.
"""

import argparse
import json
import time

from torch_timing import median_time, need_torch, wall_time

_ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_ap.add_argument("out")
_ap.add_argument("--small", action="store_true", help="tiny shapes on any device: a smoke test")
_args = _ap.parse_args()
SMALL = _args.small
torch = need_torch("microbench_moe_layer", gpu=not SMALL, smoke_flag="--small")
import torch.nn.functional as F  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"
dt = torch.bfloat16 if dev == "cuda" else torch.float32
res = {
    "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
    "torch": torch.__version__,
    "gemm": [],
    "grouped": [],
    "layer": {},
    "errors": [],
}
try:
    import transformer_engine  # noqa

    res["te"] = transformer_engine.__version__
except Exception as ex:  # noqa
    res["te"] = None


def save():
    with open(_args.out, "w") as fh:
        json.dump(res, fh, indent=1)


S = 1 if not SMALL else 16  # shrink factor for a CPU dry run
H, HD, QH, KVH, E_LOC, FF = 2880 // S, 64, (64 if S == 1 else 8), (8 if S == 1 else 2), 16, 2880 // S
SEQ = 4096 // S


def r(*shape, grad=False):
    return torch.randn(*shape, device=dev, dtype=dt, requires_grad=grad)


# ---------------------------------------------------------------- 1. dense GEMMs
t0 = time.time()
shapes = [
    ("qkv", SEQ, (QH + 2 * KVH) * HD, H),
    ("proj", SEQ, H, QH * HD),
    ("router", SEQ, 128, H),
    ("e_up_1024", 1024 // S, 2 * FF, H),
    ("e_dn_1024", 1024 // S, H, FF),
    ("e_up_4096", 4096 // S, 2 * FF, H),
    ("e_up_32768", 32768 // S, 2 * FF, H),
    ("e_wgrad_up_1024", H, 2 * FF, 1024 // S),
    ("ref_4096x6144x4096", 4096 // S, 6144 // S, 4096 // S),
    ("ref_8192x8192x8192", 8192 // S, 8192 // S, 8192 // S),
]
for name, m, n, k in shapes:
    a, b = r(m, k), r(k, n)
    t = median_time(torch, lambda a=a, b=b: a @ b, 15, 3)
    res["gemm"].append({"op": name, "m": m, "n": n, "k": k, "s": t, "tflops": 2 * m * n * k / t / 1e12})
save()

# ---------------------------------------------------------------- 2. grouped expert GEMMs
for g, rows in [(16, 1024), (16, 4096), (2, 32768), (4, 8192)]:
    rows //= S
    for nm, n, k in [("up", 2 * FF, H), ("dn", H, FF)]:
        x, w = r(g * rows, k), r(g, k, n)
        ent = {"groups": g, "rows": rows, "op": nm, "n": n, "k": k}
        fl = 2 * g * rows * n * k
        xb = x.view(g, rows, k)
        ent["bmm_s"] = median_time(torch, lambda xb=xb, w=w: torch.bmm(xb, w), 15, 3)
        ent["loop_s"] = median_time(torch, lambda xb=xb, w=w, g=g: [xb[i] @ w[i] for i in range(g)], 15, 3)
        if dev == "cuda" and hasattr(torch, "_grouped_mm"):
            offs = torch.arange(1, g + 1, device=dev, dtype=torch.int32) * rows
            try:
                ent["grouped_mm_s"] = median_time(
                    torch, lambda x=x, w=w, offs=offs: torch._grouped_mm(x, w, offs=offs), 15, 3
                )
            except Exception as ex:  # noqa
                res["errors"].append(f"grouped_mm {g}x{rows}: {ex!r}"[:300])
        ent["bmm_tflops"] = fl / ent["bmm_s"] / 1e12
        res["grouped"].append(ent)
save()


# ----------------------------------------------- 3. a GPT-OSS layer, eager (EP 8: 16 local experts, balanced)
def rope(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Params:
    pass


P = Params()
P.n1 = torch.ones(H, device=dev, dtype=dt, requires_grad=True)
P.n2 = torch.ones(H, device=dev, dtype=dt, requires_grad=True)
P.wqkv = (r((QH + 2 * KVH) * HD, H) * 0.02).requires_grad_()
P.bqkv = torch.zeros((QH + 2 * KVH) * HD, device=dev, dtype=dt, requires_grad=True)
P.wo = (r(H, QH * HD) * 0.02).requires_grad_()
P.bo = torch.zeros(H, device=dev, dtype=dt, requires_grad=True)
P.wr = (r(128, H) * 0.02).requires_grad_()
P.wup = (r(E_LOC, H, 2 * FF) * 0.02).requires_grad_()
P.bup = torch.zeros(E_LOC, 1, 2 * FF, device=dev, dtype=dt, requires_grad=True)
P.wdn = (r(E_LOC, FF, H) * 0.02).requires_grad_()
P.bdn = torch.zeros(E_LOC, 1, H, device=dev, dtype=dt, requires_grad=True)
pos = torch.arange(SEQ, device=dev, dtype=torch.float32)
inv = 1.0 / (150000 ** (torch.arange(0, HD, 2, device=dev, dtype=torch.float32) / HD))
ang = pos[:, None] * inv[None, :]
COS, SIN = ang.cos().to(dt), ang.sin().to(dt)
HOST_SYNC = [False]


def attn_block(x):
    h = F.rms_norm(x, (H,), P.n1)
    qkv = F.linear(h, P.wqkv, P.bqkv)
    q, k, v = qkv.split([QH * HD, KVH * HD, KVH * HD], dim=-1)
    q = q.view(SEQ, QH, HD).transpose(0, 1)
    k = k.view(SEQ, KVH, HD).transpose(0, 1)
    v = v.view(SEQ, KVH, HD).transpose(0, 1)
    q, k = rope(q, COS, SIN), rope(k, COS, SIN)
    k = k.repeat_interleave(QH // KVH, dim=0)
    v = v.repeat_interleave(QH // KVH, dim=0)
    o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    o = o.transpose(0, 1).reshape(SEQ, QH * HD)
    return x + F.linear(o, P.wo, P.bo)


def moe_block(x):
    h = F.rms_norm(x, (H,), P.n2)
    logits = F.linear(h, P.wr)
    topv, topi = torch.topk(logits, 4, dim=-1)
    probs = torch.softmax(topv.float(), dim=-1).to(dt)
    # force-balanced: the 4*SEQ assignments go round-robin to the 16 local experts (the a2a's rows, as if
    # local)
    flat_tok = torch.arange(SEQ, device=dev).repeat_interleave(4)
    eid = torch.arange(4 * SEQ, device=dev) % E_LOC
    order = torch.argsort(eid, stable=True)
    if HOST_SYNC[0]:
        torch.bincount(eid, minlength=E_LOC).tolist()  # dropless: tokens per expert to the host
    rows = h.index_select(0, flat_tok[order])
    xe = rows.view(E_LOC, -1, H)
    u = torch.baddbmm(P.bup, xe, P.wup)
    gate, lin = u[..., ::2], u[..., 1::2]
    gate = gate.clamp(max=7.0)
    lin = lin.clamp(-7.0, 7.0)
    a = (lin + 1) * (gate * torch.sigmoid(1.702 * gate))
    y = torch.baddbmm(P.bdn, a, P.wdn).reshape(-1, H)
    y = y * probs.reshape(-1)[order, None]
    out = torch.zeros_like(x).index_add(0, flat_tok[order], y)
    return x + out


def layer(x):
    return moe_block(attn_block(x))


x0 = r(SEQ, H, grad=True)
gx = torch.randn(SEQ, H, device=dev, dtype=dt)
L = res["layer"]
for nm, fn in [("attn", attn_block), ("moe", moe_block), ("layer", layer)]:
    try:
        L[nm + "_fw_s"] = median_time(torch, lambda fn=fn: fn(x0), 20, 3)

        def fb(fn=fn):
            fn(x0).backward(gx)

        L[nm + "_fwbw_s"] = median_time(torch, fb, 20, 3)
        L[nm + "_fwbw_wall_s"] = wall_time(torch, fb, 20, 3)
    except Exception as ex:  # noqa
        res["errors"].append(f"layer {nm}: {ex!r}"[:300])
    save()
HOST_SYNC[0] = True
try:

    def fb():
        layer(x0).backward(gx)

    L["layer_sync_fwbw_s"] = median_time(torch, fb, 20, 3)
    L["layer_sync_fwbw_wall_s"] = wall_time(torch, fb, 20, 3)

    # a stack of 9 layers back to back (one PP stage), with and without the host sync
    def stack():
        y = x0
        for _ in range(9):
            y = layer(y)
        y.backward(gx)

    L["stack9_sync_wall_s"] = wall_time(torch, stack, 5, 2)
    HOST_SYNC[0] = False
    L["stack9_nosync_wall_s"] = wall_time(torch, stack, 5, 2)
    L["stack9_nosync_gpu_s"] = median_time(torch, stack, 5, 1)
except Exception as ex:  # noqa
    res["errors"].append(f"layer sync: {ex!r}"[:300])
save()
if dev == "cuda":
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                layer(x0).backward(gx)
            torch.cuda.synchronize()
        tab = []
        for e in prof.key_averages():
            ct = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if ct:
                tab.append((e.key[:90], ct / 3 / 1e6, e.count // 3))
        tab.sort(key=lambda z: -z[1])
        res["profile_top"] = tab[:40]
    except Exception as ex:  # noqa
        res["errors"].append(f"profile: {ex!r}"[:300])
res["t_total_s"] = time.time() - t0
save()
print(
    f"wrote {_args.out}: "
    + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in res["layer"].items() if k.startswith("layer"))
)
