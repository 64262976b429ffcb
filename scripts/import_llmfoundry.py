"""Write problems/runs/llmfoundry-mpt.yaml from MosaicML llm-foundry's published throughput tables.

Source: mosaicml/llm-foundry ``scripts/train/benchmarking/README.md`` at commit 061f2c7 (2023-10-17), sections
"H100 80GB BF16", "H100 80GB FP8", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)" and "A100 40GB
with 1600 Gbps node-node interconnect (RoCE)": MPT models (125M to 70B) trained with Composer + PyTorch FSDP,
one row per measured configuration (12-step benchmark runs). Get the file with

    git clone https://github.com/mosaicml/llm-foundry
    git -C llm-foundry show 061f2c7:scripts/train/benchmarking/README.md > README.md
    python scripts/import_llmfoundry.py README.md

Every row becomes one run in the calibration-run schema (`optimizer.io.runs`); nothing is dropped except the
row already in ``shared/calibration/public_runs.yaml`` (MPT-7B, 2048 tokens, 8 A100 80GB) and rows whose
numbers contradict each other (stated below, with the reason, when the script runs). The model shapes are
those of the repository's ``scripts/train/yamls/pretrain/mpt-<size>.yaml`` at the same commit, and each is
checked against the table's NumParams column (vocab x d + max_seq_len x d learned positions
+ L x (12 d^2 + 13 d) + 2 d: biases on every linear layer and LayerNorms with bias), so a wrong shape stops
the script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

COMMIT = "061f2c7"
SOURCE = (
    "MosaicML llm-foundry scripts/train/benchmarking/README.md @061f2c7 (2023-10-17), section '{section}', "
    "row {row}"
)
# scripts/train/yamls/pretrain/mpt-<size>.yaml @061f2c7: d_model, n_heads, n_layers
# (expansion_ratio 4, vocab 50368)
SHAPES = {
    "125m": (768, 12, 12),
    "350m": (1024, 16, 24),
    "760m": (1536, 12, 24),
    "1b": (2048, 16, 24),
    "3b": (2560, 20, 32),
    "7b": (4096, 32, 32),
    "13b": (5120, 40, 40),
    "30b": (7168, 56, 48),
    "70b": (8192, 64, 80),
}
VOCAB = 50368
GPUS = {"h100_80gb": "h100-sxm-80gb", "a100_80gb": "a100-sxm-80gb", "a100_40gb": "a100-sxm-40gb"}
ALREADY = (
    "7b",
    2048,
    8,
    "a100_80gb",
)  # shared/calibration/public_runs.yaml: llmfoundry-mpt7b-a10080gb-8gpu-seq2048
COLUMNS = [
    "model",
    "seq",
    "gpus",
    "gpu",
    "mfu",
    "hfu",
    "model_tflop",
    "mb",
    "ga",
    "gbs",
    "sps",
    "tps",
    "tps_gpu",
    "gbs_tokens",
    "precision",
    "mp_mode",
    "sharding",
    "act_ckpt",
    "offload",
    "params",
]


def n_params(size: str, seq: int) -> int:
    d, _, n_layers = SHAPES[size]
    return VOCAB * d + seq * d + n_layers * (12 * d * d + 13 * d) + 2 * d


def rows(readme: str):
    """(section title, row number in its table, {column: cell}) for every data row of the result tables."""
    section, n = None, 0
    for line in readme.splitlines():
        if line.startswith("## "):
            section, n = line[3:].strip(), 0
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if section is None or len(cells) != len(COLUMNS) or cells[0] in ("Model", "---"):
            continue
        n += 1
        yield section, n, dict(zip(COLUMNS, cells, strict=True))


def run_of(section: str, n: int, c: dict, used: set[str]) -> tuple[dict | None, str | None]:
    size, seq, gpus = c["model"], int(c["seq"]), int(c["gpus"])
    mb, ga, gbs = int(c["mb"]), int(c["ga"]), int(c["gbs"])
    tps, tps_gpu = float(c["tps"]), float(c["tps_gpu"])
    if (size, seq, gpus, c["gpu"]) == ALREADY:
        return None, "already in shared/calibration/public_runs.yaml"
    if n_params(size, seq) != int(c["params"]):
        sys.exit(
            f"{section} row {n}: MPT-{size} shape gives {n_params(size, seq)} parameters, the table "
            f"{c['params']}"
        )
    if gbs % (gpus * mb) or gbs // (gpus * mb) != ga:
        return None, (
            f"global batch {gbs} is not {gpus} GPUs x micro-batch {mb} x grad-accum {ga} "
            f"(Composer then runs a smaller last micro-batch, which the schema cannot state)"
        )
    d, heads, layers = SHAPES[size]
    gpu = GPUS[c["gpu"]]
    prec = {"amp_bf16": "bf16", "bf16": "bf16", "amp_fp8": "fp8"}[c["precision"]]
    ckpt = c["act_ckpt"] == "True"
    base = f"llmfoundry-mpt{size}-{c['gpu'].replace('_', '')}-{gpus}gpu-seq{seq}" + (
        "-fp8" if prec == "fp8" else ""
    )
    rid = base if base not in used else f"{base}-mb{mb}"
    used.add(rid)
    pure = c["mp_mode"] == "PURE"
    notes = [
        "Composer/llm-foundry, PyTorch FSDP1 FULL_SHARD over all GPUs (zero3), data parallel only",
        f"MPT-{size}: d_model {d}, n_heads {heads}, n_layers {layers}, expansion_ratio 4, GeLU,"
        f" vocab {VOCAB}, "
        "learned positions, biases on every linear layer and LayerNorm (scripts/train/yamls/pretrain/"
        f"mpt-{size}.yaml @{COMMIT}; NumParams {c['params']} checked)",
        "attention: attn_impl triton (FlashAttention's Triton kernel, flash_attn_triton;"
        " submit_benchmarks.py default)",
        "torch.compile off (submit_benchmarks.py), but each element-wise op of the MPT block is one native "
        "kernel (F.layer_norm as low_precision_layernorm, F.gelu, bias in addmm, residual add;"
        " no rotary, no dropout)",
        "loss: flash-attn's fused cross-entropy on the bf16 logits (modeling_mpt.py loss_fn default "
        "fused_crossentropy, required: it raises without the xentropy kernel)",
        (
            "precision bf16 with FSDP mixed_precision PURE: parameters, "
            "gradients and their reduction in bf16, "
            "gradients reduced in bf16"
            if pure
            else f"precision {c['precision']} with FSDP mixed_precision DEFAULT: bf16 compute,"
            " fp32 gradient reduction"
        )
        + ("; FP8 GEMMs through Transformer Engine (delayed scaling, 2023)" if prec == "fp8" else ""),
        f"activation checkpointing {'on (every block): recompute full' if ckpt else 'off'}; no CPU offload",
        f"micro-batch {mb} x grad-accum {ga} x {gpus} GPUs = global batch {gbs} (table)",
        f"MFU {c['mfu']}% and HFU {c['hfu']}% stated (README 'MFU and HFU': 6N + attention convention); "
        f"derived_step_time_s = global batch x seq_len / Throughput (T/s) {c['tps']} (input arithmetic); "
        "12-step benchmark runs on the MosaicML platform",
    ]
    if gpu.startswith("h100"):
        notes.append("GPU given as 'h100_80gb': SXM assumed; interconnect not stated")
    else:
        notes.append(
            f"GPU given as '{c['gpu']}': SXM assumed (8-GPU nodes); 1600 Gbps RoCE between nodes "
            "(section title)"
        )
    run = {
        "id": rid,
        "source": SOURCE.format(section=section, row=n),
        "model": {
            "hidden": d,
            "ffn": 4 * d,
            "layers": layers,
            "heads": heads,
            "kv_heads": heads,
            "head_dim": d // heads,
            "seq_len": seq,
            "vocab": VOCAB,
            "mlp": "gelu",
            "moe": None,
        },
        "hardware": {"gpu": gpu, "num_gpus": gpus, "gpus_per_node": 8},
        "parallel": {
            "tp": 1,
            "pp": 1,
            "dp": gpus,
            "cp": 1,
            "ep": 1,
            "vpp": 1,
            "sequence_parallel": False,
            "micro_batch": mb,
            "global_batch": gbs,
            "recompute": "full" if ckpt else "none",
            "optimizer_sharding": "zero3",
            "precision": prec,
        },
        "measured": {
            "step_time_s": None,
            "derived_step_time_s": round(gbs * seq / tps, 4),
            "mfu": round(float(c["mfu"]) / 100.0, 4),
            "tflops_per_gpu": None,
            "tflops_convention": "6N+attn (MFU)",
            "tokens_per_s_per_gpu": tps_gpu,
            "peak_memory_gib": None,
        },
        "software": {"framework": "llm-foundry", "year": 2023, "attention": "flash-triton"}
        | ({"grad_reduce_dtype": "bf16"} if pure else {}),
        "tier": "A",
        "notes": "; ".join(notes),
    }
    return run, None


HEADER = (
    "# Published, measured LLM pre-training runs on PyTorch FSDP through MosaicML Composer / llm-foundry"
    " (stack `fsdp`):\n"
    "# MPT 125M-70B on 8-128 A100 (40 and 80 GB) and H100 80GB GPUs, BF16 and FP8. Same record schema as\n"
    "# shared/calibration/public_runs.yaml.\n"
    "#\n"
    "# Source: mosaicml/llm-foundry scripts/train/benchmarking/README.md @061f2c7 (2023-10-17), its four"
    " result tables.\n"
    "# Generated by scripts/import_llmfoundry.py (do not edit by hand; re-run the script and review the"
    " diff). The row\n"
    "# already in shared/calibration/public_runs.yaml (MPT-7B, 2048 tokens, 8 A100 80GB) is not"
    " repeated. Rows left out:\n"
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("readme", type=Path, help="llm-foundry scripts/train/benchmarking/README.md at 061f2c7")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "problems" / "runs" / "llmfoundry-mpt.yaml",
    )
    a = ap.parse_args(argv)
    used: set[str] = set()
    runs, left = [], []
    for section, n, cells in rows(a.readme.read_text()):
        run, why = run_of(section, n, cells, used)
        if run is None:
            left.append(
                f"#  - '{section}' row {n} (MPT-{cells['model']}, {cells['seq']} tokens, {cells['gpus']} x "
                f"{cells['gpu']}): {why}"
            )
        else:
            runs.append(run)
    body = yaml.safe_dump(runs, sort_keys=False, width=120, default_flow_style=None)
    a.out.write_text(HEADER + "\n".join(left) + f"\n# {len(runs)} runs.\n" + body)
    print(f"{len(runs)} runs written to {a.out}; {len(left)} rows left out")
    for line in left:
        print(line[3:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
