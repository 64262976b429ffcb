"""When does one site, several synchronous sites, or DiLoCo win? Sweep the WAN bandwidth of a multi-site
procurement (default: problems/studies/multisite/frontier-10gw.yaml) for one or more models, each site's
plans solved once per model and reused across the sweep (`optimizer.drivers.multisite.OfferCache`).

    python scripts/study_multisite.py [--problem FILE] [--llms megatron-1t llama3.1-70b] [--plots docs]
        [--diloco-tokens-at-8 1.5]

Prints, per model and bandwidth, the best configuration and its days to train; writes one chart per model
(`multisite-<llm>.png`: days to train against the link bandwidth, each scheme at its best number of sites).
`--diloco-tokens-at-8 X`: a sensitivity case in place of the scaling law's multiplier, X more tokens at 8
replicas and M^(log X / log 8) at M (Epoch AI reads Charles et al. 2025 as about 1.5x at M = 8).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from optimizer.drivers.multisite import OfferCache, multisite
from optimizer.io.loader import load_multisite, load_named
from optimizer.report import plots
from optimizer.schema.llm import LLM
from optimizer.schema.multisite import LinkOption

ROOT = Path(__file__).resolve().parents[1]
BANDWIDTHS_GBPS = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]


def sweep(mp, bandwidths: list[float], time_limit_s: float) -> list[dict]:
    """Every configuration considered at each bandwidth (every link at that bandwidth, free)."""
    cache = OfferCache(mp, time.time() + time_limit_s)
    rows = []
    for b in bandwidths:
        links = [
            ln.model_copy(update={"options": [LinkOption(name=f"{b:g}G", bandwidth_gbps=b)]})
            for ln in mp.links
        ]
        r = multisite(mp.model_copy(update={"links": links}), time_limit_s=time_limit_s, cache=cache)
        for c in r.considered:
            rows.append(c | {"bandwidth_gbps": b, "best": r.best.label(), "verdict": r.verdict()})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problem", default=str(ROOT / "problems/studies/multisite/frontier-10gw.yaml"))
    ap.add_argument("--llms", nargs="*", default=["megatron-1t", "llama3.1-70b"])
    ap.add_argument("--plots", default=None, help="folder for the charts (none: no charts)")
    ap.add_argument("--time-limit", type=float, default=600.0)
    ap.add_argument("--diloco-tokens-at-8", type=float, default=None)
    args = ap.parse_args(argv)
    base = load_multisite(args.problem)
    tag = ""
    if args.diloco_tokens_at_8:
        x = args.diloco_tokens_at_8
        given = {k: x ** (math.log(k) / math.log(8)) for k in range(2, len(base.sites) + 1)}
        base = base.model_copy(update={"sync": base.sync.model_copy(update={"tokens_multiplier": given})})
        tag = f"-diloco{x:g}x"
    for name in args.llms:
        mp = base.model_copy(update={"llm": load_named("llm", name, LLM)})
        rows = sweep(mp, BANDWIDTHS_GBPS, args.time_limit)
        print(
            f"\n{name}: {mp.training.tokens:.3g} tokens, {len(mp.sites)} sites of {mp.sites[0].power_mw:g} MW"
        )
        print(f"{'link Gb/s':>10}  {'best':<28} verdict")
        for b in BANDWIDTHS_GBPS:
            r = next(x for x in rows if x["bandwidth_gbps"] == b)
            print(f"{b:>10g}  {r['best']:<28} {r['verdict']}")
        if args.plots:
            path = Path(args.plots) / f"multisite-{name}{tag}.png"
            title = f"{mp.name}: {name}, days to train by link bandwidth" + (
                f" (DiLoCo: {args.diloco_tokens_at_8:g}x tokens at 8 sites)" if tag else ""
            )
            plots.plot_sites(rows, str(path), title, "bandwidth_gbps")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
