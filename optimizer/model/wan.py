"""Training across sites: the all-reduce over WAN links and what low-communication data parallelism costs.

Data parallelism across k sites is hierarchical: each site reduces its gradients inside (priced by the
site's own plan, `optimizer.model.step`), the sites exchange them over a ring of WAN links, and each site
broadcasts the result inside (the all-gather half of the site's own all-reduce). The exchange is a ring
all-reduce (Patarasuk and Yuan 2009) of V bytes over k sites, each hop one link:

    t_ar = 2 (k - 1) / k x V / (d x e x b_min) + 2 (k - 1) x l_max

with b_min the slowest link of the ring (bytes/s), l_max its longest one-way latency, e the share of the
link the transfer achieves, and d = 2 when two rings run in opposite directions on half the data each
(both directions of every full-duplex link busy; Epoch AI's assumption) else 1. Two sites have one link,
whose two directions one ring already uses: d = 1 there (each site must receive (k - 1) / k x 2V through
its link, the all-reduce's lower bound).

Pipeline stages across sites (scheme `pipeline`): the job is one pipeline whose pp stages are split over k
sites in a chain, pp / k consecutive stages each, so the gradients are reduced inside each site and only
activations (forward) and their gradients (backward) cross the k - 1 WAN links of the chain. One exchange
over link j carries every data-parallel replica's micro-batch, X = dp x b x s x h x 2 bytes (16-bit, as
Megatron-Core sends them), in J_j = l_j + X / (e b_j). Priced as `optimizer.model.pipeline_mix` prices a
join between pipeline groups (1F1B: every stage's steady state waits on the slowest exchange, fill and drain
cross every boundary once each way), over the homogeneous model's step, whose exchanges all take t_p2p:

    T = T_site + 2 n_mb max(0, max_j J_j - t_p2p) + 2 sum_j (J_j - t_p2p)

Schemes (`optimizer.schema.multisite.Scheme`), with T the slowest site's step (every site trains B / k
sequences per step) and H inner steps per outer step:
    sync      per step T + t_ar(gradients, 2 bytes/param)                       (no change in tokens)
    diloco    per H steps: H T + t_ar(pseudo-gradient, q bytes/param), or max(H T, t_ar) when the outer
              all-reduce runs under the next H steps (overlap); tokens x m(N, D, k)
The tokens multiplier m: DiLoCo's loss relative to data parallelism at N parameters and k replicas, from the
joint scaling-law fits of Charles et al. 2025, r = L_diloco(N, k) / L_dp(N); then the tokens D' at which
Chinchilla's loss (Hoffmann et al. 2022) with r applied equals data parallelism's at D:
    r L(N, D') = L(N, D)  ->  D' = (B / (L(N, D) / r - E - A / N^alpha))^(1 / beta),   m = max(1, D' / D)
(infinite when no token count reaches it). Floored at 1: where the fit says DiLoCo's loss is lower (large
N, few replicas), no credit is taken. Constants are data in `optimizer/model/wan.yaml`.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import yaml


@cache
def defaults() -> dict:
    """`optimizer/model/wan.yaml`: the cited constants."""
    return yaml.safe_load(Path(__file__).with_name("wan.yaml").read_text())


def latency_s(latency_ms: float | None, distance_km: float | None) -> float:
    """One-way latency of a link, s: its stated latency, else its fibre distance at light speed in fibre."""
    if latency_ms is not None:
        return latency_ms / 1e3
    return (distance_km or 0.0) / defaults()["fibre"]["km_per_ms"] / 1e3


def ring_all_reduce_s(
    nbytes: float,
    sites: int,
    bandwidth_gbps: float,
    latency_s_max: float,
    bidirectional: bool = True,
    efficiency: float = 1.0,
) -> float:
    """Ring all-reduce of `nbytes` over `sites` sites joined by links of at least `bandwidth_gbps` (Gb/s per
    direction) and at most `latency_s_max` one-way latency (s); 0 for one site."""
    if sites <= 1:
        return 0.0
    bw = bandwidth_gbps * 1e9 / 8.0 * efficiency * (2.0 if bidirectional and sites >= 3 else 1.0)
    return 2.0 * (sites - 1) / sites * nbytes / bw + 2.0 * (sites - 1) * latency_s_max


def ring_terms_s(nbytes: float, sites: int, bandwidth_gbps: float, bidirectional: bool, efficiency: float):
    """The two parts of `ring_all_reduce_s` that depend on a link: seconds of transfer on a link of
    `bandwidth_gbps`, and seconds per second of latency (the ring's latency term is latency x this)."""
    if sites <= 1:
        return 0.0, 0.0
    return ring_all_reduce_s(nbytes, sites, bandwidth_gbps, 0.0, bidirectional, efficiency), 2.0 * (sites - 1)


def exchange_s(nbytes: float, bandwidth_gbps: float, latency_s: float, efficiency: float = 1.0) -> float:
    """One pipeline exchange of `nbytes` over a WAN link (Gb/s per direction, one-way latency s): its
    latency and its transfer."""
    return latency_s + nbytes / (bandwidth_gbps * 1e9 / 8.0 * efficiency)


def pipeline_wan_s(n_mb: int, joins: list[float], t_p2p_s: float) -> float:
    """What the chain's WAN exchanges `joins` (s, one per link) add to a step of `n_mb` micro-batches whose
    exchanges inside a site take `t_p2p_s` (module docstring)."""
    if not joins:
        return 0.0
    return 2.0 * n_mb * max(0.0, max(joins) - t_p2p_s) + 2.0 * sum(j - t_p2p_s for j in joins)


def diloco_loss_ratio(n_params: float, replicas: int) -> float:
    """DiLoCo's evaluation loss over data parallelism's at `n_params` parameters and `replicas` replicas
    (Charles et al. 2025, joint fits)."""
    d = defaults()["diloco"]
    lo = d["diloco"]["A"] * n_params ** d["diloco"]["alpha"] * replicas ** d["diloco"]["beta"]
    return lo / (d["dp"]["A"] * n_params ** d["dp"]["alpha"])


def diloco_tokens_multiplier(n_params: float, tokens: float, replicas: int) -> float:
    """Tokens DiLoCo needs over data parallelism's `tokens` to reach the same loss (>= 1; inf: never)."""
    c = defaults()["chinchilla"]
    r = diloco_loss_ratio(n_params, replicas)
    if r <= 1.0:
        return 1.0
    loss = c["E"] + c["A"] / n_params ** c["alpha"] + c["B"] / tokens ** c["beta"]
    data_term = loss / r - c["E"] - c["A"] / n_params ** c["alpha"]
    if data_term <= 0:
        return math.inf
    return max(1.0, (c["B"] / data_term) ** (1.0 / c["beta"]) / tokens)


def round_s(inner_s: float, wan_s: float, inner_steps: int = 1, overlap: bool = False) -> float:
    """Wall time of one outer round: `inner_steps` steps of `inner_s` and an all-reduce of `wan_s` (sync:
    one step and its gradient all-reduce), in sequence or, with `overlap`, the longer of the two."""
    work = inner_steps * inner_s
    return max(work, wan_s) if overlap else work + wan_s
