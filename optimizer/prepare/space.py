"""Stage `prepare`: the candidate space of a problem (legal values of every knob) as numpy arrays.

The same space is walked by the exhaustive enumerator and modelled by the CP-SAT formulation. Knob
domains come from the problem (divisors, model shape, system) narrowed by the problem's ``search``
restrictions, written per knob as a value (``pp: 1``), a list (``tp: [4, 8]``) or a range
(``vpp: {max: 4}``). Knobs that never help in the model are fixed by default (fused kernels, flash
attention, scatter-gather p2p, 1F1B, SP all-gather redo) and can be opened through ``search``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import product
from typing import Any

import numpy as np

from optimizer.errors import ProblemError
from optimizer.model.knobs import ATTENTION, CUDA_GRAPHS, GRAD_ACCUMULATION, RECOMPUTE, TP_OVERLAP, Knobs
from optimizer.rules.layout import (
    Group,
    axis_values,
    capped,
    cp_comm_codes,
    cp_comm_limits,
    divisors,
    domain_used,
    dp_last,
    has_dp_group,
    moot,
    placement,
    rule_masks,
    zero_allowed,
)
from optimizer.schema import AttentionKernel, Problem, Search
from optimizer.schema.common import CP_COMM_CODES, MOE_DISPATCHER_CODES, SCHEDULE_CODES, V_SCHEDULES
from optimizer.schema.stack import Stack, by_layout

BOOL = [False, True]


SEARCHABLE = tuple(Search.model_fields)  # the knobs `search` may restrict (one list: the schema's)
PROBLEM_LEVEL = ("precision",)  # searched by `solve` over whole problems (one space each), not per candidate


def restrict_values(values: list, rule: Any) -> list:
    """The `values` a search rule allows: a value, a list, or a {min, max, in} range (None: all)."""
    if rule is None:
        return values
    if isinstance(rule, dict):
        bad = set(rule) - {"min", "max", "in"}
        if bad:
            raise ValueError(f"unknown range key(s) {sorted(bad)} (use min, max, in)")
        out = values
        if "in" in rule:
            out = [v for v in out if v in rule["in"]]
        if "min" in rule:
            out = [v for v in out if v >= rule["min"]]
        if "max" in rule:
            out = [v for v in out if v <= rule["max"]]
        return out
    allowed = rule if isinstance(rule, list) else [rule]
    norm = [a.value if hasattr(a, "value") else a for a in allowed]
    return [v for v in values if (v.value if hasattr(v, "value") else v) in norm]


@dataclass
class Space:
    """Legal candidates (one row each) and the size of the space before memory is checked."""

    knobs: Knobs

    @property
    def size(self) -> int:
        return self.knobs.size


OPENED = {
    "fused_layers": BOOL,
    "attention": ["flash", "standard"],
    "pp_rs_ag": BOOL,
    "schedule": ["1f1b", "gpipe", "zb", "dualpipev", "zbv"],
    "sp_ag_redo": BOOL,
    "moe_dispatcher": ["alltoall", "flex", "allgather"],
    "ep_overlap": BOOL,
    "cp_comm": ["p2p", "all_gather", "a2a", "a2a_p2p"],
    "pp_uneven": BOOL,
}
"""Knobs fixed at one value (`knob_domains`) unless `search` names them, and their values then."""


def knob_domains(problem: Problem) -> dict[str, list]:
    """Values each knob may take before the cross-knob rules (divisibility, memory)."""
    p, sysm = problem, problem.system
    n = p.num_gpus
    search = p.search_rules()
    bad = set(search) - set(SEARCHABLE)
    if bad:
        raise ProblemError(
            "<problem>",
            None,
            "search",
            f"unknown knob(s) {sorted(bad)} (searchable: {', '.join(SEARCHABLE)})",
        )
    off = sysm.offload.capacity_gib > 0
    ints = {
        k: capped(p, k, axis_values(p, k))
        for k in ("tp", "pp", "cp", "dp", "ep", "etp", "vpp", "micro_batch")
    }
    dom: dict[str, list] = {
        "tp": ints["tp"],
        "pp": ints["pp"],
        "cp": ints["cp"],
        # dp follows from the GPU count unless idle GPUs are allowed
        "dp": ints["dp"] if p.options.allow_idle_gpus else [],
        # MoE: experts split over ep ranks, each expert's matrices over etp ranks (dense: ep 1, etp = tp)
        "ep": ints["ep"],
        "etp": ints["etp"],
        # pipeline split with the embedding and loss as layer slots (only with pp > 1)
        "pp_embedding_loss": BOOL,
        "pp_uneven": [False],
        "vpp": ints["vpp"],
        "micro_batch": ints["micro_batch"],
        "recompute": list(RECOMPUTE),
        "sequence_parallel": BOOL,
        "tp_overlap": list(TP_OVERLAP),
        "zero": [0, 1, 2, 3],
        "dp_overlap": [True, False],
        "weight_offload": BOOL if off else [False],
        "activation_offload": BOOL if off else [False],
        "optimizer_offload": BOOL if off else [False],
        "fused_layers": [True],
        "attention": ["flash"],
        "pp_rs_ag": [True],
        "schedule": ["1f1b"],
        "sp_ag_redo": [True],
        "moe_dispatcher": ["alltoall"],
        "ep_overlap": [False],
        "cp_comm": ["p2p"],
    }
    allowed, _ = cp_comm_limits(p.llm, p.stack)
    if allowed is not None:  # the stack's default (p2p) cannot run the attention: the exchanges that can
        dom["cp_comm"] = [CP_COMM_CODES[c].value for c in sorted(allowed)]
    for name, rule in search.items():
        if name in PROBLEM_LEVEL:
            continue
        if name in OPENED and rule is not None:
            dom[name] = OPENED[name]
        try:
            dom[name] = restrict_values(dom[name] if dom[name] else divisors(n), rule)
        except (TypeError, ValueError) as e:
            raise ProblemError("<problem>", None, f"search.{name}", str(e)) from None
    return dom


@dataclass
class Compact:
    """The space without its cartesian product: layouts, domains and the legal (layout, vpp, micro-batch)
    triples. Every candidate is one legal triple times one value of each remaining knob (`other`)."""

    domains: dict[str, list]
    layouts: list[tuple[int, ...]]  # (tp, pp, cp, dp, ep, etp, pp_embedding_loss, pp_uneven)
    tiers: list[dict[str, int]]  # per layout: tier of tp, cp, dp, pp, ep
    triples: np.ndarray  # rows (layout index, vpp, micro_batch)
    other: list[list[tuple[str, list[int]]]]  # per layout: coded values of every other knob
    size: int
    given: dict[str, int] = field(default_factory=dict)  # codes of the knobs no candidate chooses


OTHER = [
    "recompute",
    "sequence_parallel",
    "tp_overlap",
    "zero",
    "dp_overlap",
    "weight_offload",
    "activation_offload",
    "optimizer_offload",
    "fused_layers",
    "attention",
    "pp_rs_ag",
    "schedule",
    "sp_ag_redo",
    "moe_dispatcher",
    "ep_overlap",
    "cp_comm",
]
_CODE = {
    "recompute": lambda v: RECOMPUTE.index(v),
    "tp_overlap": lambda v: TP_OVERLAP.index(v),
    "attention": lambda v: ATTENTION.index(AttentionKernel(str(getattr(v, "value", v)))),
    "schedule": lambda v: [s.value for s in SCHEDULE_CODES].index(str(getattr(v, "value", v))),
    "moe_dispatcher": lambda v: [d.value for d in MOE_DISPATCHER_CODES].index(str(getattr(v, "value", v))),
    "cp_comm": lambda v: [c.value for c in CP_COMM_CODES].index(str(getattr(v, "value", v))),
}


def _other_values(
    dom: dict[str, list],
    tp: int,
    pp: int,
    no_dp: bool,
    moe: bool = False,
    no_ep: bool = True,
    stack: Stack = Stack.MEGATRON_CORE,
    cp_codes: tuple[int, ...] = (0,),
) -> list[tuple[str, list[int]]]:
    """Coded values of every other knob for a layout (only tp == 1, no data-parallel group, pp == 1, ep == 1
    and, for MoE, tp > 1 matter), narrowed to what the stack offers in such a layout (`stack.by_layout`)."""
    per = []
    for name in OTHER:
        vals = dom[name]
        offered = by_layout(stack, name, pp, tp)
        if offered is not None:
            vals = [v for v in vals if v in offered]
        if name == "sequence_parallel" and moe and tp > 1:
            vals = [v for v in vals if v] or vals  # Megatron-Core: MoE with TP requires SP
        if name == "cp_comm":  # the exchanges this layout's heads and cp allow (`layout.cp_comm_codes`)
            legal = [v for v in vals if _CODE["cp_comm"](v) in cp_codes]
            vals = vals[:1] if cp_codes == (0,) else legal  # none legal: no such layout
        if moot(name, tp, pp, no_dp, no_ep or not moe, cp_codes == (0,)):  # no effect (`layout.moot`)
            if name == "tp_overlap":
                vals = [v for v in vals if str(getattr(v, "value", v)) == "none"] or vals[:1]
            elif name == "zero":
                vals = [z for z in range(4) if zero_allowed(z, no_dp_group=True)]  # nothing to shard
            elif name == "dp_overlap":
                vals = [True] if True in vals else vals[:1]  # no data-parallel traffic
            else:
                vals = vals[:1]
        per.append((name, [_CODE.get(name, int)(v) for v in vals]))
    return per


def _layouts(p: Problem, dom: dict[str, list]) -> list[tuple[int, int, int, int]]:
    """(tp, pp, cp, dp) of the domains under rules.gpus, dp | global batch, and network.must_fill
    (`layout.rule_masks`); dp is the rest of the GPU count unless idle GPUs are allowed."""
    n, B = p.num_gpus, p.training.global_batch
    tp, pp, cp = (
        a.reshape(-1)
        for a in np.meshgrid(*(np.array(dom[k], dtype=np.int64) for k in ("tp", "pp", "cp")), indexing="ij")
    )
    keep = tp * pp * cp <= n
    tp, pp, cp = tp[keep], pp[keep], cp[keep]
    if p.options.allow_idle_gpus:
        D = np.array(dom["dp"], dtype=np.int64)
        i, j = np.nonzero(tp[:, None] * pp[:, None] * cp[:, None] * D[None, :] <= n)
        tp, pp, cp, dp = tp[i], pp[i], cp[i], D[j]
    else:
        dp = n // (tp * pp * cp)
        if p.search_rules().get("dp") is not None:
            keep = np.isin(dp, np.array(dom["dp"], dtype=np.int64))
            tp, pp, cp, dp = tp[keep], pp[keep], cp[keep], dp[keep]
    r = rule_masks(p, tp, pp, dp, cp)
    ok = r[Group.GPUS] & (B % dp == 0) & r[Group.MUST_FILL]
    return list(zip(tp[ok].tolist(), pp[ok].tolist(), cp[ok].tolist(), dp[ok].tolist(), strict=True))


def _expand(p: Problem, dom: dict[str, list], lay: np.ndarray) -> np.ndarray:
    """Rows (tp, pp, cp, dp, ep, etp, el, un) of every layout with each legal (ep, etp) split (`layout`'s
    rules.experts; dense: (1, tp)), embedding/loss split (el only with pp > 1, when the search allows it)
    and uneven split (`_uneven`)."""
    tp, pp, cp, dp = lay.T
    if p.llm.moe is None:
        rows = np.stack([tp, pp, cp, dp, np.ones_like(tp), tp], axis=1)
    else:
        split = np.array([(e, t) for t in dom["etp"] for e in dom["ep"]], dtype=np.int64).reshape(-1, 2)
        i, j = np.repeat(np.arange(len(lay)), len(split)), np.tile(np.arange(len(split)), len(lay))
        ok = rule_masks(p, tp[i], pp[i], dp[i], cp[i], ep=split[j, 0], etp=split[j, 1])[Group.EXPERTS]
        i, j = i[ok], j[ok]
        rows = np.concatenate([lay[i][:, :4], split[j]], axis=1)
    out = []
    for el in sorted({int(x) for x in dom["pp_embedding_loss"]}):
        sel = rows[rows[:, 1] > 1] if el else rows
        out.append(np.concatenate([sel, np.full((len(sel), 1), el, dtype=np.int64)], axis=1))
    if 0 not in {int(x) for x in dom["pp_embedding_loss"]}:  # without a pipeline there is no split to make
        sel = rows[rows[:, 1] == 1]
        out.append(np.concatenate([sel, np.zeros((len(sel), 1), dtype=np.int64)], axis=1))
    X = np.concatenate(out) if out else np.zeros((0, 7), dtype=np.int64)
    X = np.concatenate([X, _uneven(p, dom, X[:, 1], X[:, 6])[:, None]], axis=1)
    if p.mtp_layers and {True, False} <= {bool(v) for v in dom["pp_uneven"]}:
        # with MTP modules a custom layout differs from the split by layers even where pp divides it (the
        # MTP blocks take its slots rather than adding to the last stage): both are searched
        even = X[(X[:, 1] > 1) & (X[:, 7] == 0)].copy()
        even[:, 7] = 1
        X = np.concatenate([X, even])
    return X


def _uneven(p: Problem, dom: dict[str, list], pp: np.ndarray, el: np.ndarray) -> np.ndarray:
    """pp_uneven of each layout (0/1): where the search allows uneven splits, the layouts whose layer slots pp
    does not divide (an even split that divides is the same plan); where it allows only uneven ones, every
    pipelined layout. The space's vpp then divides ceil(slots / pp) (`compact_space`)."""
    vals = {bool(v) for v in dom["pp_uneven"]}
    if True not in vals:
        return np.zeros_like(pp)
    slots = p.llm.layers + 2 * el
    return ((pp > 1) & ((slots % pp != 0) | (False not in vals))).astype(np.int64)


def _cp_code_sets(p: Problem, tp: np.ndarray, cp: np.ndarray) -> np.ndarray:
    """Per layout, the legal CP exchanges as a bit mask over `CP_COMM_CODES` (`layout.cp_comm_codes`)."""
    dom_gpus = p.system.networks[0].used
    allowed, _ = cp_comm_limits(p.llm, p.stack)
    if len(tp) == 0:
        return np.zeros(0, dtype=np.int64)
    pairs, inv = np.unique(np.stack([tp, cp], axis=1), axis=0, return_inverse=True)
    masks = np.array(
        [
            sum(1 << x for x in cp_comm_codes(p.llm.heads, p.llm.kv, t, c, dom_gpus, allowed))
            for t, c in pairs.tolist()
        ],
        dtype=np.int64,
    )
    return masks[inv.reshape(-1)]


def compact_space(problem: Problem) -> Compact:
    """Legal layouts and (layout, vpp, micro-batch) triples, every rule from `optimizer.rules.layout`
    evaluated on whole arrays at once."""
    p, llm = problem, problem.llm
    dom = knob_domains(p)
    sizes = [net.size for net in p.system.networks]
    V, M = np.array(dom["vpp"], dtype=np.int64), np.array(dom["micro_batch"], dtype=np.int64)
    lay = np.array(_layouts(p, dom), dtype=np.int64).reshape(-1, 4)
    X = _expand(p, dom, lay)
    tp, pp, cp, dp, ep, etp, el, un = (X[:, i] for i in range(8))
    # the vpp x micro-batch grid of every row in one call
    r = rule_masks(
        p,
        tp[:, None, None],
        pp[:, None, None],
        dp[:, None, None],
        cp[:, None, None],
        vpp=V[None, :, None],
        micro_batch=M[None, None, :],
        ep=ep[:, None, None],
        etp=etp[:, None, None],
        pp_embedding_loss=el[:, None, None],
        pp_uneven=un[:, None, None],
        # an uneven split interleaves only where vpp divides the busiest stage's ceil(slots / pp) layers:
        # then the busiest chunk holds ceil(slots / (pp vpp)) = ceil(slots / pp) / vpp and the stage's count
        # is the layout's (the solver's tables factor layout, vpp and micro-batch apart)
        searched=True,
    )
    ok = np.broadcast_to(r[Group.LAYERS] & r[Group.BATCH] & r[Group.INTERLEAVE], (len(X), len(V), len(M)))
    tiers_all = placement(
        sizes, tp, cp, dp, pp, ep, etp, used=domain_used(p.system), dp_last=dp_last(p.execution)
    )
    # the other knobs' values depend on four predicates of a layout only (`_other_values`): one per class
    no_dp = ~np.asarray(has_dp_group(dp * cp, tp * cp * dp // (ep * etp)), dtype=bool)
    cpc = _cp_code_sets(p, tp, cp)  # bit mask of the legal CP exchanges (`layout.cp_comm_codes`)
    cls = (tp == 1) * 8 + no_dp * 4 + (pp == 1) * 2 + (ep == 1) + 16 * cpc
    rows = np.nonzero(ok.any(axis=(1, 2)))[0]
    by_cls: dict[int, list] = {}
    for k in np.unique(cls[rows]).tolist():  # one representative layout per class
        x = int(rows[np.argmax(cls[rows] == k)])
        codes = tuple(c for c in range(len(CP_COMM_CODES)) if int(cpc[x]) >> c & 1)
        by_cls[k] = _other_values(
            dom, int(tp[x]), int(pp[x]), bool(no_dp[x]), llm.moe is not None, bool(ep[x] == 1), p.stack, codes
        )
    # a class where the stack leaves some knob no value (torchtitan: no ZeRO-2/3 with pp) has no layout
    full = [k for k, per in by_cls.items() if all(v for _, v in per)]
    sel = rows[np.isin(cls[rows], full)]
    xi, vi, mi = np.nonzero(ok[sel])
    tri = np.stack([xi, V[vi], M[mi]], axis=1).astype(np.int64) if len(xi) else np.zeros((0, 3), np.int64)
    layouts = [tuple(int(v) for v in row) for row in X[sel].tolist()]
    keys = list(tiers_all)
    cols = [tiers_all[k][sel].tolist() for k in keys]
    tiers = [dict(zip(keys, vals, strict=True)) for vals in zip(*cols, strict=True)]
    others = [by_cls[int(c)] for c in cls[sel].tolist()]
    c = Compact(dom, layouts, tiers, tri, others, 0, given_knobs(p))
    return replace(c, size=int(triple_sizes(p, c).sum()))


V_CODES = [SCHEDULE_CODES.index(s) for s in SCHEDULE_CODES if s.value in V_SCHEDULES]


def v_runs_at(B: int, pp, dp, vpp, mb):
    """Whether a V schedule (DualPipeV, ZB-V) is legal at these layout values: without a pipeline (the
    schedule is moot there), or two stages per rank and at least one micro-batch per stage
    (`optimizer.model.compose.v_schedule`); elsewhere its rows are not in the space."""
    from optimizer.model.compose import v_schedule

    pp, dp, vpp, mb = (np.asarray(x, dtype=np.int64) for x in (pp, dp, vpp, mb))
    return (pp == 1) | v_schedule(True, pp, vpp, B // np.maximum(dp * mb, 1))


def triple_sizes(problem: Problem, c: Compact) -> np.ndarray:
    """Candidates of each triple of `c`: the product of its layout's other values, less the V-schedule
    values where a V schedule cannot run (`v_runs_at`)."""
    n_all, n_v = [], []
    for per in c.other:
        d = dict(per)
        n = int(np.prod([len(vals) for vals in d.values()]))
        sched = d.get("schedule", [1])
        n_all.append(n)
        n_v.append(n // len(sched) * sum(1 for s in sched if s in V_CODES))
    if len(c.triples) == 0:
        return np.zeros(0, dtype=np.int64)
    li, v, b = c.triples[:, 0], c.triples[:, 1], c.triples[:, 2]
    lay = np.array(c.layouts, dtype=np.int64).reshape(-1, 8)
    ok = v_runs_at(problem.training.global_batch, lay[li, 1], lay[li, 3], v, b)
    return np.array(n_all, dtype=np.int64)[li] - np.where(ok, 0, np.array(n_v, dtype=np.int64)[li])


def build_space(problem: Problem, c: Compact | None = None) -> Space:
    """Every legal candidate of the problem (memory not yet checked); of the compact space `c` (default: its
    own; a part of it enumerates a part of the space)."""
    c = c or compact_space(problem)
    rows: list[np.ndarray] = []
    by_layout: dict[int, list[tuple[int, int]]] = {}
    for li, v, b in c.triples.tolist():
        by_layout.setdefault(li, []).append((v, b))
    for li, vb in by_layout.items():
        tp, pp, cp, dp, ep, etp, el, un = c.layouts[li]
        rest = np.array(list(product(*[vals for _, vals in c.other[li]])), dtype=np.int64)
        tr = c.tiers[li]
        sched_col = [n for n, _ in c.other[li]].index("schedule")
        v_rows = np.isin(rest[:, sched_col], V_CODES)
        for v, b in vb:
            keep = rest if bool(v_runs_at(problem.training.global_batch, pp, dp, v, b)) else rest[~v_rows]
            head = np.tile(
                np.array(
                    [tp, pp, dp, cp, v, b, tr["tp"], tr["cp"], tr["dp"], tr["pp"], ep, etp, tr["ep"], el, un],
                    dtype=np.int64,
                ),
                (len(keep), 1),
            )
            rows.append(np.concatenate([head, keep], axis=1))
    if not rows:
        return Space(Knobs.from_dict({f: [] for f in Knobs.__dataclass_fields__}))
    M = np.concatenate(rows, axis=0)
    tp, pp, dp, cp, vpp, mb, t_tp, t_cp, t_dp, t_pp, ep, etp, t_ep, el, un = (M[:, i] for i in range(15))
    other = {name: M[:, 15 + i] for i, name in enumerate(OTHER)}  # OTHER names the Knobs fields they fill
    k = Knobs(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=etp,
        vpp=vpp,
        micro_batch=mb,
        pp_embedding_loss=el,
        pp_uneven=un,
        tp_comm=other["sequence_parallel"],
        tier_tp=t_tp,
        tier_cp=t_cp,
        tier_ep=t_ep,
        tier_dp=t_dp,
        tier_pp=t_pp,
        **other,
        **{name: np.array([code]) for name, code in c.given.items()},
    )
    assert k.size == c.size
    return Space(k)


def given_knobs(problem: Problem) -> dict[str, int]:
    """Codes of the knobs no candidate chooses, as the problem's execution gives them (after its stack's
    defaults): CUDA graphs, Transformer Engine's fused expert MLP, where the router's probabilities apply and
    how the weight gradients are accumulated (`stack.fixed_by_stack`)."""
    ex = problem.execution
    return {
        "cuda_graphs": CUDA_GRAPHS.index(ex.cuda_graphs),
        "moe_fused_mlp": int(ex.moe_fused_mlp),
        "moe_probs_in_act": int(ex.moe_probs_in_act),
        "grad_accumulation": GRAD_ACCUMULATION.index(ex.grad_accumulation),
    }
