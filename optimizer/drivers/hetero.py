"""Heterogeneous purchases (`procure.heterogeneous: data`): data-parallel replicas on two node types.

Modelled form: group A (nodes of type a) and group B (type b) each run their own plan, with its own tp,
pp, micro-batch, recompute, ZeRO, offload, on its share of the global batch (b_A + b_B = B sequences).
Each group's step time T_A(n_A, b_A) is the proven optimum of the homogeneous sub-problem (its own
intra-group data-parallel reduction included). The job's step time is

    T = max(T_A, T_B) + X,   X = all-reduce of the gradients between the two groups
        (P x gradient bytes, split over the GPUs of the smaller group, two parties, on the joining network;
        not overlapped),

the slowest group plus the cross-type synchronisation. The share b_A runs over every multiple of B/16 and
the best split is kept: a group's step time is not monotone in its batch (the batch must divide over its
data-parallel ranks, so a group may use fewer of its nodes at one share than at the next), and a bisection
for where T_A(b_A) crosses T_B(B - b_A) missed the best split (2 H100 + 8 A100 nodes on 96 sequences: 48/48
gives 0.095 s, the crossing 36/60 0.112 s).

Which mixes are searched: a second type can only add speed when a node type cannot take the whole budget,
i.e. its availability or the power cap binds. Each such capped type (an anchor) takes its limit, and each of
the PARTNERS best other types (by the homogeneous ranking) takes what the remaining budget and power allow
(and its availability). Each mix is the best of this family of splits, with both groups solved to proven
optimality; pipeline stages on different types (uneven layer counts) are not modelled. For the speed goals a
mix is skipped when even the sum of the two groups' throughputs with the whole batch (a group does not get
faster per sequence with fewer sequences: fewer micro-batches, more bubble and DP sync per sequence) cannot
beat the best purchase found, and a batch share is skipped when the slower of the two groups, each at its
whole-batch time per sequence times its share, cannot.
"""

from __future__ import annotations

from optimizer.drivers.purchase import (
    Group,
    Purchase,
    TypeRow,
    best_of_type,
    node_limit,
    purchase_of,
    rank_key,
)
from optimizer.model.hardware import Tiers, collective_time
from optimizer.model.params import count
from optimizer.model.step import make_ctx
from optimizer.schema.procure import Pricing, ProcureProblem

SHARES = 16  # the batch split is searched over multiples of B/SHARES
PARTNERS = 3  # next-best node types tried as the partner of the anchor


def sync_time_s(pp: ProcureProblem, ga: Group, gb: Group) -> float:
    """Cross-type gradient all-reduce: every gradient crosses once each way between the two groups, spread
    over the GPUs of the smaller group, on the joining network (default: the slower outermost tier)."""
    nets = [ga.node_type.system.networks[-1], gb.node_type.system.networks[-1]]
    net = pp.catalog.joining_network or min(nets, key=lambda n: n.bandwidth_gbps * n.efficiency)
    tiers = Tiers.of(ga.node_type.system.model_copy(update={"networks": [net]}))
    grad_bytes = make_ctx(ga.plan.evaluation.problem).grad_bytes
    per_gpu = count(pp.llm).total * grad_bytes / min(ga.gpus_used, gb.gpus_used)
    return float(collective_time("ar", per_gpu, 2, 0, tiers))


def _remaining(pp: ProcureProblem, anchor: TypeRow, nodes_a: int) -> float | None:
    pr = pp.procure
    if pr.pricing == Pricing.CAPEX and pr.budget_usd is not None:
        return pr.budget_usd - nodes_a * anchor.node_type.node_usd
    return pr.budget_usd


def _partner_nodes(pp: ProcureProblem, anchor: TypeRow, partner: TypeRow) -> int:
    """Nodes of `partner` that the budget and power cap leave beside the anchor at its limit (0: none)."""
    pr, na = pp.procure, anchor.max_nodes
    rest = _remaining(pp, anchor, na)
    if rest is not None and rest <= 0:
        return 0
    pw = None if pr.power_kw is None else pr.power_kw - na * anchor.node_type.power_kw
    if pw is not None and pw <= 0:
        return 0
    sub = pp.model_copy(update={"procure": pr.model_copy(update={"power_kw": pw})}) if pw else pp
    return node_limit(sub, partner.node_type, budget_usd=rest)[0]


def _mix(pp: ProcureProblem, ga: Group, gb: Group) -> Purchase | None:
    """The two groups as one purchase (the slower group plus the cross-type sync), or None when its bill
    (capex or rental) or power exceeds the problem's limits."""
    pr = pp.procure
    x = sync_time_s(pp, ga, gb)
    p = purchase_of(pp, [ga, gb], max(ga.step_time_s, gb.step_time_s) + x, x)
    if pr.budget_usd is not None and p.cost_usd > pr.budget_usd * (1 + 1e-9):
        return None
    if pr.power_kw is not None and p.power_kw is not None and p.power_kw > pr.power_kw * (1 + 1e-9):
        return None
    return p


def best_mix(
    pp: ProcureProblem,
    rows: list[TypeRow],
    time_limit_s: float = 60.0,
    cache=None,
    solve_group=None,
    prune: bool = True,
) -> tuple[Purchase | None, int]:
    """The best two-type mix of the family above (None: no mix fits), and how many mixes were evaluated.
    `solve_group(type, nodes, batch)`: how a group is solved (procure's worker pool, where each type's tables
    are); default `best_of_type` here with `cache`. `prune=False` solves every share (tests: the bounds
    never lose the best mix)."""
    fits = [r for r in rows if r.purchase is not None]
    if len(fits) < 1 or len(rows) < 2:
        return None, 0
    B = pp.training.global_batch
    pr = pp.procure
    memo: dict = {}

    def group(t, nodes: int, batch: int):
        """The proven-best group (a rental budget caps each group's GPU-hours; the mix's bill is checked
        below)."""
        key = (t.name, nodes, batch)
        if key not in memo:
            memo[key] = (
                solve_group(t, nodes, batch)
                if solve_group
                else best_of_type(pp, t, nodes, global_batch=batch, time_limit_s=time_limit_s, cache=cache)
            )[0]
        return memo[key]

    best, n_eval, pruned = None, 0, 0
    speed_goal = pr.goal.value in ("throughput", "time_to_train")
    bar = min(r.purchase.step_time_s for r in fits) if speed_goal and prune else None
    anchors = [r for r in rows if r.bound_by in ("availability", "power")]
    ranked = sorted(fits, key=lambda r: rank_key(pp, r.purchase))
    pairs = [(a, b) for a in anchors for b in [r for r in ranked if r is not a][:PARTNERS]]
    for anchor, partner in pairs:
        na, nb = anchor.max_nodes, _partner_nodes(pp, anchor, partner)
        if nb < 1:
            continue
        shares = sorted({B * k // SHARES for k in range(1, SHARES)} - {0, B})
        lb = dict.fromkeys(shares, 0.0)
        if bar is not None:  # throughput bound: each group at most as fast as with the whole batch
            gfull = group(partner.node_type, nb, B)
            if gfull is None:
                continue
            a_step = anchor.purchase.step_time_s if anchor.purchase else None
            if a_step is not None and B / (B / a_step + B / gfull.step_time_s) >= bar:
                pruned += 1
                continue
            if a_step is not None:  # per share: each group's time per sequence at least its whole-batch one
                lb = {ba: max(a_step * ba / B, gfull.step_time_s * (B - ba) / B) for ba in shares}
        # every batch share k/SHARES of the anchor (the same share twice when B < SHARES: once), the most
        # promising first; a share whose bound cannot beat the best found is not solved
        for ba in sorted(shares, key=lambda s: lb[s]):
            if bar is not None and lb[ba] >= bar:
                pruned += 1
                continue
            ga = group(anchor.node_type, na, ba)
            gb = None if ga is None else group(partner.node_type, nb, B - ba)
            if ga is None or gb is None:
                continue
            n_eval += 1
            p = _mix(pp, ga, gb)
            if p is None:
                continue
            if best is None or rank_key(pp, p) < rank_key(pp, best):
                best = p
                if bar is not None:
                    bar = min(bar, p.step_time_s)
    return best, n_eval + pruned
