#!/usr/bin/env python3
"""The model's kernels against a real GPU's microbenchmarks (the size-aware kernels).

    python scripts/bench_kernels.py [--json] [--measurements FILE] [--system h100-sxm-80gb] [--quick]

Times every measured op with the model's own functions (`optimizer.model.hardware.Hardware`, the same calls
`optimizer.model.layer` makes) on the system file, and prints per class the count, the median |error| and the
mean signed error (model / measured - 1), and the worst case:
- gemm: BF16 and FP8 GEMMs at layer shapes and squares (`Hardware.gemm`, FP8 operands 1 byte);
- attention: causal flash attention forward+backward (`Hardware.attention_kernel`, the layer's flops and
  bytes: 4 b h s^2 d / 2 forward, 2.5x that backward);
- elementwise: add, gelu, layer/RMS norm, dropout with the measured bytes (`Hardware.vector`);
- block: whole pre-norm blocks, forward + backward, at tp 1 (`optimizer.model.layer.block_cost`);
- ring: one rank of load-balanced ring attention (context parallelism), forward + backward, from
  scripts/microbench_ring_attention.py (`flash_attention(..., cp=cp)`);
- cudnn_attn, sinks: cuDNN's fused attention with and without a 128-token window and learned sinks, forward +
  backward, and the backward time the sinks add, from scripts/microbench_cudnn_attention.py
  (`flash_attention(..., window=, sinks=)`);
- expert_eager: Megatron-Core's eager expert-MLP passes for GPT-OSS (clamped GLU, expert biases), forward +
  backward, from scripts/microbench_expert_eager.py (`layer.clamp_passes`, `layer.expert_bias_passes`);
- precisions: a layer's GEMMs forward and backward in per-tensor FP8, MXFP8 and NVFP4 relative to BF16,
  against Transformer Engine's benchmark_gemm.py tables (problems/measurements/b300-te-gemm-precisions.json,
  inputs pre-quantised), and the MXFP8 kernel factor `hardware.BLOCK_SCALED_KERNEL` derived from them
  (`block_scaled_kernel`);
- the FP8 GEMM's efficiency against BF16's at the same layer shapes, the measured
  `matrix_efficiency_scale.fp8` (`fp8_gemm_scale`).
The default file is ../shared/measurements/h100-sxm-80gb-microbench.json (beside the project); targets of the
model's kernels, checked on that file (exit 1 when missed; the model is deterministic): attention and GEMM
median |error| <= 15%, block <= 7%. --quick: without --measurements, the shipped
problems/measurements/h200-sxm-141gb-microbench.json on h200-sxm-141gb (a smoke test that needs nothing beside
the project).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.io.loader import load_named  # noqa: E402
from optimizer.model.hardware import Hardware  # noqa: E402
from optimizer.model.layer import clamp_passes, expert_bias_passes, flash_attention  # noqa: E402
from optimizer.schema import LLM, Execution, Precision, Problem, System, Training  # noqa: E402

DEFAULT = ROOT.parent / "shared" / "measurements" / "h100-sxm-80gb-microbench.json"
QUICK = (ROOT / "problems" / "measurements" / "h200-sxm-141gb-microbench.json", "h200-sxm-141gb")
TARGETS = {"gemm": 15.0, "attention": 15.0, "block": 7.0}  # median |error| %, on DEFAULT
FLOPS_PER = {"add": 1.0, "gelu": 8.0, "layernorm": 8.0, "rmsnorm": 5.0, "dropout": 2.0}


def gemm_errors(data: dict, system: System) -> list[tuple[str, float]]:
    out = []
    for g in data.get("gemm", []):
        prec = {"fp8": Precision.FP8, "fp32": Precision.FP32}.get(g["dtype"], Precision.BF16)
        if system.peak_tflops(prec) is None:  # a datatype the system has no matrix peak for (FP8 on A100)
            continue
        hw = Hardware(system, prec)
        t = float(hw.gemm(g["m"], g["n"], g["k"], in_bytes=1 if prec == Precision.FP8 else 2, out_bytes=2))
        out.append(
            (f"{g['dtype']} {g['m']}x{g['n']}x{g['k']} ({g.get('model')}, {g.get('op')})", t / g["s"] - 1)
        )
    return out


def attention_errors(data: dict, system: System) -> list[tuple[str, float]]:
    hw = Hardware(system, Precision.BF16)
    out = []
    for a in data.get("attn", []):
        b, s, h, kv, d = a["b"], a["s"], a["heads"], a["kv_heads"], a["head_dim"]
        fw, bw, _ = flash_attention(hw, b, h, kv, d, s, s, 2.0)  # the layer's own kernel, BF16
        t = float(fw + bw)
        out.append((f"b{b} s{s} heads {h}/{kv}", t / a["fwbw_s"] - 1))
    return out


def elementwise_errors(data: dict, system: System) -> list[tuple[str, float]]:
    hw = Hardware(system, Precision.BF16)
    out = []
    for e in data.get("elem", []):
        n = e["tokens"] * e["hidden"]
        for op, m in e["ops"].items():
            t = float(hw.vector(n * FLOPS_PER.get(op, 2.0), m["bytes"]))
            out.append((f"{op} {e['tokens']}x{e['hidden']}", t / m["s"] - 1))
    return out


def block_errors(data: dict, system: System) -> list[tuple[str, float]]:
    from optimizer.model.knobs import from_execution
    from optimizer.model.layer import block_cost
    from optimizer.model.step import make_ctx

    out = []
    for r in data.get("layer", []):
        try:
            llm = load_named("llm", r["model"], LLM)
        except Exception:  # a model not in the library: its shape from the record
            llm = LLM(
                name=r["model"],
                hidden=r["hidden"],
                ffn=r["ffn"],
                layers=max(r["layers"], 1),
                heads=r["heads"],
                kv_heads=r["kv_heads"],
                head_dim=r["head_dim"],
                seq_len=r["seq"],
                vocab=32000,
                mlp="swiglu" if r["gated"] else "gelu",
            )
        llm = llm.model_copy(update={"dropout": False})
        p = Problem(
            llm=llm,
            system=system,
            num_gpus=1,
            training=Training(global_batch=r["micro_batch"], seq_len=r["seq"]),
        )
        ex = Execution(micro_batch=r["micro_batch"], fused_layers=bool(r["compiled"]))
        k = from_execution(ex, system, 1)
        blk = block_cost(make_ctx(p), k)
        t = float(np.asarray(blk.fw_total + blk.bw_total).reshape(-1)[0])
        out.append(
            (
                f"{r['model']} mb{r['micro_batch']} s{r['seq']} {'compiled' if r['compiled'] else 'eager'}",
                t / r["per_layer_s"] - 1,
            )
        )
    return out


def ring_errors(data: dict, system: System) -> list[tuple[str, float]]:
    """One rank's load-balanced ring attention, forward + backward (scripts/microbench_ring_attention.py: the
    causal step, cp-1 half-chunk steps, fp32 merges; K/V expanded to the query heads), against the layer's own
    kernel with cp (`flash_attention(..., cp=cp)`; `flash2` rows on the FlashAttention-2 class)."""
    hw = Hardware(system, Precision.BF16)
    out = []
    for r in data.get("rows", []):
        if "cp" not in r:  # another file's rows (microbench_cudnn_attention.py's)
            continue
        fw, bw, _ = flash_attention(
            hw,
            1,
            r["heads"],
            r["heads"],
            r["head_dim"],
            r["tokens_per_rank"],
            r["seq"],
            2.0,
            fa2=r["backend"] == "flash2",
            cp=float(r["cp"]),
        )
        out.append((f"{r['backend']} cp{r['cp']} {r['seq']} tokens", float(fw + bw) / r["fwbw_s"] - 1))
    return out


def cudnn_variants(data: dict, system: System) -> dict[tuple[str, str], tuple[float, float, float, float]]:
    """Per row of scripts/microbench_cudnn_attention.py (cuDNN's fused attention through its graph API, as
    Transformer Engine runs it) and per variant (causal, causal_sink, window, window_sink): {(shape label,
    variant): (the model's forward s, backward s from `flash_attention` with the variant's window and sinks,
    the measured forward s, backward s)}."""
    hw = Hardware(system, Precision.BF16)
    win = float(data.get("window", 128))
    out = {}
    for r in data.get("rows", []):
        if "causal_sink" not in r:  # another file's rows (microbench_ring_attention.py's)
            continue
        shape = f"b{r['b']} h{r['heads']}/{r['kv_heads']} d{r['head_dim']} s{r['s']}"
        for name in ("causal", "causal_sink", "window", "window_sink"):
            if name in r:
                fw, bw, _ = flash_attention(
                    hw,
                    r["b"],
                    r["heads"],
                    r["kv_heads"],
                    r["head_dim"],
                    r["s"],
                    r["s"],
                    2.0,
                    window=win if name.startswith("window") else None,
                    sinks=name.endswith("_sink"),
                )
                out[shape, name] = (float(fw), float(bw), r[name]["fw_s"], r[name]["bw_s"])
    return out


def sink_errors(data: dict, system: System) -> list[tuple[str, float]]:
    """Learned attention sinks: the backward time they add (the model's `Hardware.sink_backward`, i.e.
    backward with sinks minus without) against the measured difference, causal and windowed."""
    v = cudnn_variants(data, system)
    return [
        (f"{name} {shape}", (bw - v[shape, base][1]) / (mbw - v[shape, base][3]) - 1)
        for (shape, name), (_, bw, _, mbw) in v.items()
        if name.endswith("_sink") and (shape, base := name.removesuffix("_sink")) in v
    ]


def cudnn_attention_errors(data: dict, system: System) -> list[tuple[str, float]]:
    """cuDNN's fused attention, forward + backward, per variant (with and without a 128-token window and
    sinks)."""
    return [
        (f"{name} {shape}", (fw + bw) / (mfw + mbw) - 1)
        for (shape, name), (fw, bw, mfw, mbw) in cudnn_variants(data, system).items()
    ]


EAGER_PASSES = {"clamp": (clamp_passes, "up"), "bias": (expert_bias_passes, "hidden")}


def expert_eager_errors(data: dict, system: System) -> list[tuple[str, float]]:
    """Megatron-Core's eager expert-MLP passes (scripts/microbench_expert_eager.py: the clamped GLU's clamps
    and the probability-scaled expert biases), forward + backward, against the model's own
    (`layer.clamp_passes`, `layer.expert_bias_passes`, 16-bit)."""
    hw = Hardware(system, Precision.BF16)
    out = []
    for r in data.get("rows", []):
        if "clamp" not in r:  # another file's rows
            continue
        for name, (fn, width) in EAGER_PASSES.items():
            fw, bw = fn(hw, float(r["rows"]) * data[width], 2.0)
            out.append(
                (f"{name} {r['rows']} rows / {r['experts']} experts", float(fw + bw) / r[name]["fwbw_s"] - 1)
            )
    return out


def expert_eager_rates(data: dict, system: System) -> dict[str, tuple[float, float]]:
    """What `layer.EAGER_EXPERT_MEASURED` holds, from a scripts/microbench_expert_eager.py file: per pass
    kind, the measured forward and backward times over the counted passes' times on the system's element-wise
    tables (the pass functions at rate 1), averaged over the file's largest row count (bandwidth-bound
    kernels; smaller ones add per-kernel host time the eager MoE host floor holds)."""
    import optimizer.model.layer as layer

    hw = Hardware(system, Precision.BF16)
    rows = [r for r in data.get("rows", []) if "clamp" in r]
    big = [r for r in rows if r["rows"] == max(x["rows"] for x in rows)]
    saved = layer.EAGER_EXPERT_MEASURED
    layer.EAGER_EXPERT_MEASURED = {k: (1.0, 1.0) for k in saved}
    try:
        out = {}
        for name, (fn, width) in EAGER_PASSES.items():
            ratios = []
            for r in big:
                fw, bw = fn(hw, float(r["rows"]) * data[width], 2.0)
                m_fw = r[name]["fw_s"]
                ratios.append((m_fw / float(fw), (r[name]["fwbw_s"] - m_fw) / float(bw)))
            out[name] = tuple(round(float(x), 2) for x in np.mean(ratios, axis=0))
        return out
    finally:
        layer.EAGER_EXPERT_MEASURED = saved


# a Transformer Engine benchmark_gemm.py model-config file: per pass, the layer's GEMM time in each precision
TE_PASSES = {"forward": ("fprop",), "backward": ("dgrad", "wgrad")}  # the model's passes (`Hardware.linear`)
TE_PRECISIONS = {"fp8_current": Precision.FP8_CURRENT, "mxfp8": Precision.MXFP8, "nvfp4": Precision.NVFP4}


def te_layer_linears(data: dict) -> list[tuple[str, int, int, int]]:
    """The layer's four linears (name, rows M, inputs K, outputs N) of a b300-te-gemm-precisions.json-style
    file: tokens x hidden into QKV, attention output, MLP up and down (benchmark_gemm.py's model-config
    shapes)."""
    m, h, f = data["tokens"], data["hidden"], data["intermediate"]
    qkv = h + 2 * data["kv_heads"] * (h // data["heads"])
    return [("qkv", m, h, qkv), ("attn out", m, h, h), ("mlp up", m, h, f), ("mlp down", m, f, h)]


def te_layer_time(hw: Hardware, linears, in_bytes: float) -> tuple[float, float]:
    """The model's (forward, backward) GEMM time of the layer's linears (`Hardware.linear`, as
    `layer.block_cost` prices them: the backward is the data and the weight gradient)."""
    fw = bw = 0.0
    for _, m, k, n in linears:
        f, b, _ = hw.linear(m, n, k, in_bytes=in_bytes, out_bytes=2)
        fw, bw = fw + float(f), bw + float(b)
    return fw, bw


def block_scaled_kernel(data: dict) -> float:
    """What `hardware.BLOCK_SCALED_KERNEL[mxfp8]` holds, from the file: the per-tensor FP8 layer's
    pre-quantised GEMM time over the MXFP8 one's (the same datasheet peak), summed over the three GEMMs of
    each linear."""
    pq = data["per_layer_ms"]["pre_quantized"]
    return round(sum(pq[p]["fp8_current"] for p in pq) / sum(pq[p]["mxfp8"] for p in pq), 3)


def fp8_gemm_scale(data: dict, system: System) -> float | None:
    """What `System.matrix_efficiency_scale[fp8]` holds where it is measured: the FP8 GEMM's fraction of its
    datasheet peak over the BF16 one's at the same layer shape (`gemm` records of microbench.py, squares
    left out), the geometric mean over every shape measured in both; None without such pairs."""
    import math

    def key(g):
        return (g.get("model"), g.get("tp"), g.get("tokens"), g.get("op"), g["m"], g["n"], g["k"])

    bf16 = {
        key(g): g["s"] for g in data.get("gemm", []) if g["dtype"] == "bf16" and g.get("model") != "square"
    }
    peaks = system.peak_tflops(Precision.BF16) / system.peak_tflops(Precision.FP8)
    logs = [
        math.log(bf16[key(g)] / g["s"] * peaks)
        for g in data.get("gemm", [])
        if g["dtype"] == "fp8" and key(g) in bf16
    ]
    return round(math.exp(sum(logs) / len(logs)), 3) if logs else None


def precision_errors(data: dict, system: System) -> list[tuple[str, float]]:
    """Per pass and quantised precision, the model's layer GEMM time relative to BF16 against the measured
    (pre-quantised) one: (model ratio) / (measured ratio) - 1."""
    from optimizer.model.hardware import BYTES

    if "per_layer_ms" not in data:
        return []
    linears = te_layer_linears(data)
    pq = data["per_layer_ms"]["pre_quantized"]

    def measured(key, pass_):
        return sum(pq[g][key] for g in TE_PASSES[pass_])

    t16 = te_layer_time(Hardware(system, Precision.BF16), linears, 2.0)
    out = []
    for key, prec in TE_PRECISIONS.items():
        if system.peak_tflops(prec) is None:
            continue
        t = te_layer_time(Hardware(system, prec), linears, BYTES[prec])
        for i, pass_ in enumerate(TE_PASSES):
            out.append(
                (
                    f"{key} {pass_} / bf16",
                    (t[i] / t16[i]) / (measured(key, pass_) / measured("bf16", pass_)) - 1,
                )
            )
    return out


def summary(rows: list[tuple[str, float]]) -> dict:
    if not rows:
        return {"n": 0, "median_abs_error_pct": None, "mean_signed_error_pct": None, "worst": None}
    e = np.array([x for _, x in rows])
    worst = max(rows, key=lambda r: abs(r[1]))
    return {
        "n": len(rows),
        "median_abs_error_pct": round(100 * float(np.median(np.abs(e))), 1),
        "mean_signed_error_pct": round(100 * float(np.mean(e)), 1),
        "worst": {"op": worst[0], "error_pct": round(100 * worst[1], 1)},
    }


def missed_targets(out: dict) -> list[str]:
    """The classes whose median |error| is above its target (`TARGETS`, percent)."""
    return [
        f"{k}: median |error| {out[k]['median_abs_error_pct']}% > {t}%"
        for k, t in TARGETS.items()
        if out[k]["n"] and out[k]["median_abs_error_pct"] > t
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--measurements", default=None, help=f"default {DEFAULT} ({QUICK[0].name} with --quick)")
    ap.add_argument("--system", default=None, help=f"default h100-sxm-80gb ({QUICK[1]} with --quick)")
    ap.add_argument("--quick", action="store_true", help="score the shipped H200 file (a smoke test)")
    a = ap.parse_args(argv)
    if a.measurements is None:
        a.measurements, a.system = (
            (str(QUICK[0]), a.system or QUICK[1]) if a.quick else (str(DEFAULT), a.system)
        )
    a.system = a.system or "h100-sxm-80gb"
    path = Path(a.measurements)
    if not path.is_file():
        print(f"no measurements at {path} (see ../shared/measurements/README.md)", file=sys.stderr)
        return 2
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as ex:
        print(f"{path}: not a measurements file ({ex})", file=sys.stderr)
        return 2
    if not isinstance(data, dict) or not any(
        data.get(k) for k in ("gemm", "attn", "elem", "layer", "rows", "per_layer_ms")
    ):
        print(
            f"{path}: no table this script scores (gemm, attn, elem, layer from microbench.py; rows from "
            "microbench_ring_attention.py and microbench_cudnn_attention.py; per_layer_ms from Transformer "
            "Engine's benchmark_gemm.py)",
            file=sys.stderr,
        )
        return 2
    system = load_named("system", a.system, System)
    try:
        out = {
            "system": system.name,
            "measurements": path.name,
            "gemm": summary(gemm_errors(data, system)),
            "attention": summary(attention_errors(data, system)),
            "elementwise": summary(elementwise_errors(data, system)),
            "block": summary(block_errors(data, system)),
            "ring": summary(ring_errors(data, system)),
            "cudnn_attn": summary(cudnn_attention_errors(data, system)),
            "sinks": summary(sink_errors(data, system)),
            "expert_eager": summary(expert_eager_errors(data, system)),
            "precisions": summary(precision_errors(data, system)),
        }
        if out["expert_eager"]["n"]:
            out["expert_eager_rates"] = expert_eager_rates(data, system)
        if "per_layer_ms" in data:
            out["block_scaled_kernel"] = block_scaled_kernel(data)
        fp8_scale = fp8_gemm_scale(data, system) if system.peak_tflops(Precision.FP8) else None
        if fp8_scale is not None:
            out["fp8_gemm_scale"] = fp8_scale
    except (KeyError, TypeError) as ex:
        print(
            f"{path}: a record lacks a field this script reads ({ex!r}): not a microbench.py / "
            "microbench_ring_attention.py / microbench_cudnn_attention.py file?",
            file=sys.stderr,
        )
        return 2
    missed = missed_targets(out) if path.resolve() == DEFAULT.resolve() else []
    for msg in missed:
        print(f"FAILED: target missed: {msg}", file=sys.stderr)
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"model ({system.name}) against {path.name}: median |error|, mean signed error, worst")
        for k in (
            "gemm",
            "attention",
            "elementwise",
            "block",
            "ring",
            "cudnn_attn",
            "sinks",
            "expert_eager",
            "precisions",
        ):
            s = out[k]
            if not s["n"]:
                print(f"  {k:12s} n=   0  (not measured)")
                continue
            print(
                f"  {k:12s} n={s['n']:4d}  median |err| {s['median_abs_error_pct']:6.1f}% "
                f" mean {s['mean_signed_error_pct']:+6.1f}%"
                f"  worst {s['worst']['error_pct']:+.1f}% ({s['worst']['op']})"
            )
        if "expert_eager_rates" in out:
            print(
                "  measured rates of the eager expert passes (layer.EAGER_EXPERT_MEASURED): "
                f"{out['expert_eager_rates']}"
            )
        if "block_scaled_kernel" in out:
            print(
                f"  MXFP8 kernel throughput against per-tensor FP8 (hardware.BLOCK_SCALED_KERNEL): "
                f"{out['block_scaled_kernel']}"
            )
        if "fp8_gemm_scale" in out:
            print(
                "  FP8 GEMM efficiency against BF16's at the same layer shapes "
                f"(matrix_efficiency_scale.fp8): {out['fp8_gemm_scale']}"
            )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
