#!/usr/bin/env python3
"""Time cuDNN's fused attention as Transformer Engine calls it for GPT-OSS: causal, 128-token sliding window
and learnable softmax sinks, forward and backward, through the cuDNN frontend's graph API.

    python scripts/microbench_cudnn_attention.py OUT.json

Needs PyTorch with a CUDA GPU and `nvidia-cudnn-frontend` >= 1.20 (its Python graph API exposes `sink_token`
and `dSink_token`; cuDNN >= 9.13 runs them). Megatron-Core's GPT-OSS layers (Megatron-Bridge
`gpt_oss_bridge.py`: `softmax_type = "learnable"`, `window_size = (sliding_window - 1, 0)`, every second layer
windowed) reach cuDNN through Transformer Engine's FusedAttention; what such a kernel costs against plain
causal attention is what microbench.py (PyTorch SDPA: no sinks, no window) cannot say. Per shape (micro-batch,
query heads, K/V heads, sequence, head size) it times, with CUDA events (median of --repeats after warm-up,
random data):
- `causal`, `causal_sink`, `window`, `window_sink`: one forward graph and one backward graph each (`fw_s`,
  `bw_s`); the window's left bound is 128 keys (the query and its 127 predecessors), right bound 0;
- `sdpa_cudnn`: PyTorch's SDPA forced to its cuDNN backend, causal, forward and forward+backward: the kernel
  microbench.py's tables hold, as a check that the graph path times the same kernel.
A variant cuDNN rejects is recorded under `errors` and the others still run. Output in problems/measurements/.
"""

from __future__ import annotations

import argparse
import json
import sys

from torch_timing import median_time, need_torch

# (micro-batch, query heads, K/V heads, sequence, head size): GPT-OSS-120B's rank at tp 1 with micro-batch 1
# (the H100 run) and 4 (the Blackwell runs), at tp 2, 4 and 8 (32, 16, 8 heads), at 2K-16K tokens;
# Llama-3-class 128-wide heads as the reference
SHAPES = (
    (1, 64, 8, 4096, 64),
    (4, 64, 8, 4096, 64),
    (1, 32, 8, 4096, 128),
    (1, 64, 8, 8192, 64),
    (2, 32, 4, 4096, 64),
    (1, 16, 2, 4096, 64),
    (1, 8, 1, 4096, 64),
    (1, 64, 8, 2048, 64),
    (1, 64, 8, 16384, 64),
    (1, 8, 1, 16384, 128),
)
WINDOW = 128
VARIANTS = {
    "causal": (None, False),
    "causal_sink": (None, True),
    "window": (WINDOW, False),
    "window_sink": (WINDOW, True),
}


def graphs(torch, cudnn, handle, b, hq, hkv, s, d, window, sink):
    """(forward, backward) callables over fresh random tensors: one cuDNN graph each, built once."""
    bf16, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    dev = "cuda"
    # bshd memory (Transformer Engine's sbhd/bshd layouts), logical b, h, s, d dims
    q_g = torch.randn(b, s, hq, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    k_g = torch.randn(b, s, hkv, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    v_g = torch.randn(b, s, hkv, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    o_g = torch.empty(b, s, hq, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    do_g = torch.randn(b, s, hq, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    st_g = torch.empty(b, hq, s, 1, device=dev, dtype=torch.float32)
    dq_g, dk_g, dv_g = torch.empty_like(q_g), torch.empty_like(k_g), torch.empty_like(v_g)
    sink_g = torch.randn(1, hq, 1, 1, device=dev, dtype=torch.float32)
    dsink_g = torch.zeros(1, hq, 1, 1, device=dev, dtype=torch.float32)
    scale = d**-0.5
    mask = dict(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0)
    if window is not None:
        mask["diagonal_band_left_bound"] = window

    def build(g):
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        return torch.empty(g.get_workspace_size(), device=dev, dtype=torch.uint8)

    gf = cudnn.pygraph(io_data_type=bf16, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    q, k, v = gf.tensor_like(q_g), gf.tensor_like(k_g), gf.tensor_like(v_g)
    kw = dict(mask)
    sk = None
    if sink:
        sk = gf.tensor_like(sink_g)
        kw["sink_token"] = sk
    o, st = gf.sdpa(name="fw", q=q, k=k, v=v, generate_stats=True, attn_scale=scale, **kw)
    o.set_output(True).set_dim(list(o_g.shape)).set_stride(list(o_g.stride()))
    st.set_output(True).set_data_type(f32)
    ws_f = build(gf)
    pack_f = {q: q_g, k: k_g, v: v_g, o: o_g, st: st_g}
    if sink:
        pack_f[sk] = sink_g

    def fw():
        gf.execute(pack_f, ws_f, handle=handle)

    fw()  # the backward reads this forward's output and statistics
    torch.cuda.synchronize()

    gb = cudnn.pygraph(io_data_type=bf16, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    bq, bk, bv = gb.tensor_like(q_g), gb.tensor_like(k_g), gb.tensor_like(v_g)
    bo, bdo, bst = gb.tensor_like(o_g), gb.tensor_like(do_g), gb.tensor_like(st_g)
    kw = dict(mask)
    bsk = bdsk = None
    if sink:
        bsk, bdsk = gb.tensor_like(sink_g), gb.tensor_like(dsink_g)
        kw["sink_token"], kw["dSink_token"] = bsk, bdsk
    dq, dk, dv = gb.sdpa_backward(
        name="bw", q=bq, k=bk, v=bv, o=bo, dO=bdo, stats=bst, attn_scale=scale, **kw
    )
    for t, g in ((dq, dq_g), (dk, dk_g), (dv, dv_g)):
        t.set_output(True).set_dim(list(g.shape)).set_stride(list(g.stride()))
    if sink:
        bdsk.set_output(True)
    ws_b = build(gb)
    pack_b = {bq: q_g, bk: k_g, bv: v_g, bo: o_g, bdo: do_g, bst: st_g, dq: dq_g, dk: dk_g, dv: dv_g}
    if sink:
        pack_b[bsk], pack_b[bdsk] = sink_g, dsink_g

    def bw():
        gb.execute(pack_b, ws_b, handle=handle)

    return fw, bw


def sdpa_cudnn(F, backend, timer, q, k, v) -> dict:
    """`timer`'s seconds for PyTorch's causal `F.scaled_dot_product_attention` under the `backend` context
    (cuDNN's), forward (`fw_s`) and forward+backward (`fwbw_s`), for q [b, heads, s, d] and k, v
    [b, kv_heads, s, d]."""
    with backend:

        def fw_t():
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1]
            )

        return {"fw_s": timer(fw_t), "fwbw_s": timer(lambda: fw_t().sum().backward())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    torch = need_torch(
        "microbench_cudnn_attention", gpu=True, smoke_flag=None
    )  # cuDNN's graphs run on a GPU only
    torch.cuda.init()
    try:
        import cudnn
    except ImportError:
        print(
            "microbench_cudnn_attention needs nvidia-cudnn-frontend >= 1.20: "
            "pip install nvidia-cudnn-frontend",
            file=sys.stderr,
        )
        return 2
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn_backend": int(cudnn.backend_version()),
        "cudnn_frontend": getattr(cudnn, "__version__", "?"),
        "window": WINDOW,
        "rows": [],
        "errors": [],
    }

    def timer(fn):
        return median_time(torch, fn, args.repeats, args.warmup)

    for b, hq, hkv, s, d in SHAPES:
        row = {"b": b, "heads": hq, "kv_heads": hkv, "s": s, "head_dim": d}
        for name, (window, sink) in VARIANTS.items():
            try:
                fw, bw = graphs(torch, cudnn, handle, b, hq, hkv, s, d, window, sink)
                row[name] = {"fw_s": timer(fw), "bw_s": timer(bw)}
            except Exception as exc:  # noqa: BLE001 - a variant this cuDNN rejects: recorded, the rest still run
                res["errors"].append({"shape": [b, hq, hkv, s, d], "variant": name, "error": repr(exc)[:400]})
            print(row.get(name, "failed"), name, (b, hq, hkv, s, d), flush=True)
        q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        try:
            row["sdpa_cudnn"] = sdpa_cudnn(F, sdpa_kernel(SDPBackend.CUDNN_ATTENTION), timer, q, k, v)
        except Exception as exc:  # noqa: BLE001
            res["errors"].append(
                {"shape": [b, hq, hkv, s, d], "variant": "sdpa_cudnn", "error": repr(exc)[:400]}
            )
        res["rows"].append(row)
        del q, k, v
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res["errors"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
