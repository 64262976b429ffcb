"""Calculon Study 5 (Isaev et al. 2023, Table 3) with paraplan: per model and node variant (HBM x DDR), the
fastest training that $125M buys, next to the paper's figures, and the Spearman rank correlation of
throughput per $M with the paper's, per model.

    python scripts/study5.py [--json] [--models 175b,530b,1t]

Problems: problems/studies/procure/study5-{175b,530b,1t}.yaml (catalog problems/catalogs/study5-h100.yaml).
Throughput is in samples (sequences) per second, as the paper's "Perf"; throughput per $M divides it by
the cost of the GPUs used in $M. The paper's Perf/$M column is on another scale (x100); only ranks are
compared.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.drivers.procure import procure  # noqa: E402
from optimizer.io.loader import load_procure  # noqa: E402

# Table 3: (HBM GiB, DDR GiB) -> {model: (GPUs, Perf, Perf/$M)}; the second "40G 1T" row is 20G/1T by the
# price pattern (see the catalog's header).
PAPER = {
    (20, 0): {"1t": (5120, 105, 93), "530b": (5600, 365, 293), "175b": (5472, 1143, 939)},
    (40, 0): {"1t": (4864, 223, 184), "530b": (4984, 475, 381), "175b": (4672, 1211, 1037)},
    (80, 0): {"1t": (4096, 232, 189), "530b": (4080, 405, 331), "175b": (3744, 1014, 903)},
    (120, 0): {"1t": (3072, 179, 145), "530b": (2880, 293, 254), "175b": (3120, 875, 701)},
    (20, 256): {"1t": (4912, 297, 244), "530b": (5040, 531, 426), "175b": (4672, 1253, 1083)},
    (40, 256): {"1t": (4544, 275, 220), "530b": (4440, 396, 325), "175b": (4544, 1219, 975)},
    (80, 256): {"1t": (3840, 234, 187), "530b": (3840, 415, 333), "175b": (3744, 1014, 834)},
    (120, 256): {"1t": (2928, 167, 135), "530b": (2880, 316, 258), "175b": (2928, 812, 652)},
    (20, 512): {"1t": (3872, 236, 189), "530b": (3864, 418, 335), "175b": (3744, 1014, 840)},
    (40, 512): {"1t": (3504, 215, 175), "530b": (3360, 367, 312), "175b": (3568, 967, 774)},
    (80, 512): {"1t": (3072, 189, 154), "530b": (2880, 316, 272), "175b": (3120, 865, 693)},
    (120, 512): {"1t": (2496, 156, 125), "530b": (2496, 280, 224), "175b": (2496, 700, 561)},
    (20, 1024): {"1t": (2944, 181, 146), "530b": (2880, 316, 259), "175b": (2944, 803, 645)},
    (40, 1024): {"1t": (2728, 171, 139), "530b": (2760, 302, 244), "175b": (2672, 749, 623)},
    (80, 1024): {"1t": (2496, 156, 125), "530b": (2496, 280, 224), "175b": (2496, 700, 561)},
    (120, 1024): {"1t": (2080, 132, 106), "530b": (2080, 238, 190), "175b": (2080, 596, 478)},
}


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):  # ties share their mean rank
            idx = x == v
            r[idx] = r[idx].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def run(model: str) -> dict:
    pp = load_procure(ROOT / "problems" / "studies" / "procure" / f"study5-{model}.yaml")
    res = procure(pp)
    rows = []
    for r in res.rows:
        sysm = r.node_type.system
        key = (int(sysm.hbm_gib), int(sysm.offload.capacity_gib))
        paper = PAPER[key][model]
        p = r.purchase
        thr = 0.0 if p is None else pp.training.global_batch / p.step_time_s
        musd = 0.0 if p is None else p.cost_usd / 1e6
        rows.append(
            {
                "hbm_gib": key[0],
                "ddr_gib": key[1],
                "gpus": 0 if p is None else p.groups[0].gpus_used,
                "throughput": thr,
                "throughput_per_musd": thr / musd if musd else 0.0,
                "paper_gpus": paper[0],
                "paper_throughput": paper[1],
                "paper_throughput_per_musd": paper[2],
            }
        )
    rho = spearman([x["throughput_per_musd"] for x in rows], [x["paper_throughput_per_musd"] for x in rows])
    best = res.best
    return {
        "spearman": rho,
        "rows": rows,
        "best": None if best is None else best.label(),
        "seconds": res.seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--models", default="175b,530b,1t")
    a = ap.parse_args()
    out = {"models": {m: run(m) for m in a.models.split(",")}}
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    for m, d in out["models"].items():
        print(
            f"\n=== {m}: best purchase {d['best']}; Spearman(throughput/$M vs paper) = {d['spearman']:.3f} "
            f"({d['seconds']:.1f} s)"
        )
        print(
            f"{'HBM':>5s} {'DDR':>5s} | {'GPUs':>5s} {'samples/s':>9s} {'per $M':>7s} | paper: {'GPUs':>5s} "
            f"{'Perf':>5s} {'Perf/$M':>7s}"
        )
        for r in d["rows"]:
            print(
                f"{r['hbm_gib']:5d} {r['ddr_gib']:5d} | {r['gpus']:5d} {r['throughput']:9.1f} "
                f"{r['throughput_per_musd']:7.2f} |        {r['paper_gpus']:5d} {r['paper_throughput']:5d} "
                f"{r['paper_throughput_per_musd']:7d}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
