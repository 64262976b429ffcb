#!/usr/bin/env python3
"""Throughput of the vectorised analytical model: candidates evaluated per second on one core.

    python scripts/bench_model.py [--n 200000] [--repeat 5] [--json] [--quick]

Builds a random grid of executions of GPT-3 175B on 1024 H100 (every knob varied, legal or not: the model
evaluates them all) and times `optimizer.model.step.evaluate` on it, median of --repeat runs. Also times the
same candidates one by one on a sample, and prints the ratio. Target: >= 100,000 per second
(machine-dependent: reported, not checked). --quick: 2,000 candidates, one run, a sample of 20 (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimizer.io.loader import load_problem  # noqa: E402
from optimizer.model.knobs import Knobs  # noqa: E402
from optimizer.model.step import evaluate, make_ctx  # noqa: E402


def grid(n: int, rng: np.random.Generator) -> Knobs:
    def pick(values):
        return rng.choice(np.asarray(values, dtype=np.int64), size=n)

    tp = pick([1, 2, 4, 8])
    pp = pick([1, 2, 4, 8, 16])
    cp = np.ones(n, dtype=np.int64)
    dp = 1024 // (tp * pp)
    return Knobs(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=np.ones(n, np.int64),
        etp=tp,
        vpp=pick([1, 2, 3, 4]),
        micro_batch=pick([1, 2, 4]),
        recompute=pick([0, 1, 2]),
        sequence_parallel=pick([0, 1]),
        tp_comm=pick([0, 1]),
        sp_ag_redo=pick([0, 1]),
        tp_overlap=pick([0, 1, 2]),
        pp_rs_ag=pick([0, 1]),
        pp_embedding_loss=np.zeros(n, np.int64),
        dp_overlap=pick([0, 1]),
        zero=pick([0, 1, 2, 3]),
        fused_layers=pick([0, 1]),
        attention=pick([0, 1]),
        schedule=pick([0, 1]),
        weight_offload=np.zeros(n, np.int64),
        activation_offload=np.zeros(n, np.int64),
        optimizer_offload=np.zeros(n, np.int64),
        tier_tp=np.zeros(n, np.int64),
        tier_cp=np.zeros(n, np.int64),
        tier_ep=np.zeros(n, np.int64),
        tier_dp=np.ones(n, np.int64),
        tier_pp=np.ones(n, np.int64),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="2,000 candidates, one run (a smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.repeat = min(args.n, 2000), 1
    problem = load_problem(ROOT / "problems" / "default.yaml")
    ctx = make_ctx(problem)
    k = grid(args.n, np.random.default_rng(0))
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        evaluate(problem, k, ctx)
        times.append(time.perf_counter() - t0)
    vec = float(np.median(times))
    sample = min(20 if args.quick else 200, args.n)
    t0 = time.perf_counter()
    for i in range(sample):
        evaluate(problem, k.take([i]), ctx)
    one = (time.perf_counter() - t0) / sample
    out = {
        "candidates": args.n,
        "vectorised_s": vec,
        "candidates_per_s": args.n / vec,
        "scalar_s_per_candidate": one,
        "speedup_vs_scalar": one * args.n / vec,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{args.n} candidates in {vec:.3f} s (median of {args.repeat}): "
            f"{args.n / vec:,.0f} candidates/s; "
            f"one at a time {one * 1e3:.2f} ms each: vectorised is {out['speedup_vs_scalar']:.0f}x faster"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
