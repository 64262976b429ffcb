"""Tables of the CP-SAT formulation, filled by the analytical model (never a second copy of the physics).

The step time (`optimizer.model.step`) is composed of terms that each depend on few knobs:
- per *layout* l = (tp, pp, dp, cp, ep, etp, placement): B*L/(dp*pp), B/dp, L/pp, the DP collectives (AR, RS,
  AG of the stage's gradients/weights), optimizer time and weight/gradient/optimizer memory per ZeRO stage;
- per *layout+vpp* lv: layers per chunk L/(pp*vpp), the overlap window factor, p2p count factors,
  in-flight layers of the interleaved schedule;
- per (layout, micro-batch) lm: micro-batches n_mb and n_mb*L/pp, in-flight layers of 1F1B;
- per *block* beta = (tp, cp, ep, etp, micro-batch, recompute, SP, TP overlap): per-layer time tau, forward and
  backward parts, LM-head/loss time, p2p time, stored and working activations, logits.
The knobs in `OTHER_KNOBS` (kernels, p2p, schedule, SP redo, offload flags) change every table: each
combination the space allows is a *variant* with its own tables (`build_all`), all filled by the same
model calls (the variant knobs are extra columns of each grid).
Each table is read from `evaluate(...).terms` on a small grid of candidates, so the numbers are the
model's own; `formulations.step_time` combines them with the same sums, products and maxima as
`optimizer.model.step`. Units: time in `TIME_UNIT` = 1 ns, memory in KiB (usage rounded up, capacity
rounded down: a plan the solver accepts never exceeds a capacity of the exact model).

Columns (the composition factors are defined in `optimizer.model.compose`):

    per layout (L)      A1 [sequences x layers], A2 [sequences], Ls [layers], pm2 [exchanges]: layout factors
                        tpcp [index]: the block group (tp, cp, ep, etp); tp1, ppgt1, dpg1 [0/1]: tp == 1,
                        pp > 1, no (expert-)data-parallel group; hc [0..2]: head column (pp = 1; pp > 1;
                        pp > 1 with embedding/loss slots)
                        AR, RS, AG [ns]: the stage's DP all-reduce, reduce-scatter, all-gather; F [ns]: FSDP
                        traffic per micro-batch (2 AG + RS); ARb, RSb, AGb, Fb [ns]: one bucket (a layer) of each
                        opt{z} [ns]: optimizer step, wgo{z} / off{z} [KiB]: state in HBM / offload memory, per
                        ZeRO stage z; reserved [KiB]: runtime reserve; PA, PR, PG [ns]: PyTorch FSDP's copies
                        around one gradient all-reduce / reduce-scatter / parameter gather (0 on other stacks)
    per (layout, vpp)   Lc [layers], Wm [layer backwards], E [exchanges x sequences], Bf [layer times],
                        inflv [layers]: vpp factors; ARv, RSv [ns]: AR and RS over vpp
    per (layout, mb)    nmb [micro-batches], NL [layers x micro-batches], infl1 [layers]: micro-batch factors
    per block (BETA)    tau [ns]: one layer, one micro-batch; tau_mb [ns/sequence]: tau / mb; fwt, bwt, fbt
                        [ns]: its forward, backward, both; head [ns] per (head column, PP tier): the edge
                        stage's LM head and loss per micro-batch (the p2p it hides is taken off per pair,
                        `formulations.pairs.compose`); p2p [ns] per PP tier: one exchange; p2p_window [ns]: a
                        layer's forward, which Lc of hide an interleaved exchange (`compose.p2p_steady`);
                        offx_mb [ns/sequence]: exposed offload streaming of a layer; stored, working,
                        embout, logits [KiB]: activations of a layer kept, rebuilt
                        by recompute, the embedding output and the logits
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import product

import numpy as np

from optimizer.model.capacity import capacity_bytes
from optimizer.model.compose import fsdp_traffic, layout_factors, mb_factors, vpp_factors
from optimizer.model.knobs import Knobs
from optimizer.model.step import evaluate, make_ctx
from optimizer.schema import Problem
from optimizer.prepare.space import Compact

TIME_UNIT = 1e9  # integer time unit per second (1 ns)
KIB = 1024.0


def t_int(x) -> np.ndarray:
    return np.rint(np.asarray(x, dtype=float) * TIME_UNIT).astype(np.int64)


def kib_up(x) -> np.ndarray:
    return np.ceil(np.asarray(x, dtype=float) / KIB - 1e-9).astype(np.int64)


@dataclass
class Tables:
    problem: Problem
    # layouts
    lay: dict[str, np.ndarray]  # columns tp, pp, dp, cp, tier_* per layout
    L: dict[str, np.ndarray]  # integer tables per layout
    # values of the per-candidate knobs
    v_vals: list[int]
    mb_vals: list[int]
    rec_vals: list[int]
    sp_vals: list[int]
    ov_vals: list[int]
    z_vals: list[int]
    dpo_vals: list[int]
    tpcp: list[tuple[int, int, int, int]]  # block groups (tp, cp, ep, etp); layout -> index L["tpcp"]
    LV: dict[str, np.ndarray]  # per (layout, v index), flattened l*nV + vi
    LM: dict[str, np.ndarray]  # per (layout, mb index), flattened l*nM + mi
    BETA: dict[str, np.ndarray]  # per block index (see beta_index)
    legal_lvm: np.ndarray  # rows: legal (l, vi, mi)
    cap_kib: int
    n_candidates: int
    fixed: dict[str, int] = field(default_factory=dict)  # the variant: codes of the OTHER_KNOBS
    pu_tiers: list[float] = field(default_factory=list)
    off_cap_kib: int = 0  # offload memory per GPU, KiB (rounded down)
    var: int = 0  # index of the variant among `build_all`'s
    cand_per_layout: np.ndarray | None = None  # candidates of the space per layout (sizes of subsets)

    def gpus(self, l: np.ndarray) -> np.ndarray:
        """GPUs used by layouts l: tp*pp*dp*cp."""
        return (self.lay["tp"] * self.lay["pp"] * self.lay["dp"] * self.lay["cp"])[l]

    @property
    def nV(self) -> int:
        return len(self.v_vals)

    @property
    def nM(self) -> int:
        return len(self.mb_vals)


OTHER_KNOBS = ("fused_layers", "attention", "sp_ag_redo", "pp_rs_ag", "schedule", "ep_dispatcher", "ep_overlap",
               "weight_offload", "activation_offload", "optimizer_offload")
"""Knobs that set a *variant* (one set of tables each): kernels, p2p, schedule, MoE dispatch and offload flags."""


def knob_grid(fixed: dict, n: int, **cols) -> Knobs:
    """n candidates: the given columns, the variant's knobs (`fixed`: scalars or arrays of n), everything else
    at its neutral value."""
    base = dict(tp=1, pp=1, dp=1, cp=1, ep=1, pp_embedding_loss=0, vpp=1, micro_batch=1, recompute=0, sequence_parallel=0, tp_overlap=0, dp_overlap=0, zero=0,
                tier_tp=0, tier_cp=0, tier_ep=0, tier_dp=0, tier_pp=0)
    base.update({name: fixed[name] for name in OTHER_KNOBS})
    base.update(cols)
    base["tp_comm"] = base["sequence_parallel"]
    base.setdefault("etp", base["tp"])
    return Knobs(**{k: np.broadcast_to(np.asarray(v, dtype=np.int64), (n,)).copy() for k, v in base.items()})


def _union(c: Compact) -> dict[str, set[int]]:
    """Per knob of `c.other`, the coded values any layout allows."""
    union: dict[str, set[int]] = {}
    seen: set[int] = set()
    for per in c.other:  # layouts share a few distinct lists: look at each once
        if id(per) in seen:
            continue
        seen.add(id(per))
        for n, vs in per:
            union.setdefault(n, set()).update(vs)
    return union


def variants(c: Compact) -> list[dict[str, int]]:
    """Every combination of the values the space gives the variant knobs (`OTHER_KNOBS`), as codes."""
    union = _union(c)
    return [dict(zip(OTHER_KNOBS, combo)) for combo in product(*[sorted(union[n]) for n in OTHER_KNOBS])]


def build_tables(problem: Problem, c: Compact) -> Tables:
    """The tables of a space with a single variant (tests and tools; the solver uses `build_all`)."""
    Ts = build_all(problem, c)
    if len(Ts) != 1:
        raise ValueError(f"{len(Ts)} variants: use build_all")
    return Ts[0]


def restrict(Ts: list[Tables], problem: Problem) -> tuple[list[Tables], int]:
    """The tables of `problem` from those of the same problem with more GPUs and idle GPUs allowed (the same
    LLM, batch, search and options, and a system that differs at most in its memory capacities, which enter
    no table: only the capacity rows): a larger GPU count's space holds every smaller layout, so the subset
    is the rows of layouts within problem.num_gpus. Returns the tables and the subset's size."""
    T0 = Ts[0]
    keep_l = T0.gpus(np.arange(len(T0.lay["tp"]))) <= problem.num_gpus
    cap = int(np.floor(capacity_bytes(problem) / KIB))
    off_cap = int(np.floor(problem.system.offload.capacity_gib * 2.0**30 / KIB))
    out = [replace(T, problem=problem, legal_lvm=T.legal_lvm[keep_l[T.legal_lvm[:, 0]]], cap_kib=cap,
                   off_cap_kib=off_cap) for T in Ts]
    return out, int(T0.cand_per_layout[keep_l].sum())


def build_all(problem: Problem, c: Compact) -> list[Tables]:
    """The tables of every variant of the space that has legal triples, filled in one pass: each call to the
    model evaluates the grid of every variant at once (the variant knobs as columns)."""
    if c.size == 0:
        raise ValueError("empty space: solve_cpsat answers it before building tables")
    union = _union(c)
    # which variants each layout admits (the space narrows some knobs per layout: no p2p without pp, ...)
    allv = variants(c)
    nL = len(c.layouts)
    admits = np.zeros((len(allv), nL), dtype=bool)
    for li in range(nL):
        per = {n: set(vs) for n, vs in c.other[li] if n in OTHER_KNOBS}
        for vi_, v in enumerate(allv):
            admits[vi_, li] = all(v[k] in per[k] for k in v)
    keep_v = [i for i in range(len(allv)) if admits[i].any()]
    allv, admits = [allv[i] for i in keep_v], admits[keep_v]
    nVar = len(allv)
    fixed_cols = {k: np.array([v[k] for v in allv], dtype=np.int64) for k in OTHER_KNOBS}

    lay = {n: np.array([lt[i] for lt in c.layouts])
           for i, n in enumerate(("tp", "pp", "cp", "dp", "ep", "etp", "pp_embedding_loss"))}
    for ax in ("tp", "cp", "dp", "pp", "ep"):
        lay[f"tier_{ax}"] = np.array([t[ax] for t in c.tiers])

    def dom_codes(name):
        return sorted(union[name])

    vals = {"vpp": np.unique(c.triples[:, 1]).tolist(), "mb": np.unique(c.triples[:, 2]).tolist(),
            "recompute": dom_codes("recompute"), "sp": dom_codes("sequence_parallel"),
            "tp_overlap": dom_codes("tp_overlap"), "zero": dom_codes("zero"), "dp_overlap": dom_codes("dp_overlap")}
    # the block's group key: (tp, cp, ep, etp) (their tiers follow from them)
    tpcp = sorted({tuple(int(x) for x in key) for key in zip(lay["tp"], lay["cp"], lay["ep"], lay["etp"])})
    tpcp_index = {x: i for i, x in enumerate(tpcp)}
    ctx = make_ctx(problem)
    llm = problem.llm
    B, Lyr = problem.training.global_batch, llm.layers

    def run(n: int, **cols) -> dict[str, np.ndarray]:
        """The model's terms on n rows per variant, as arrays of shape (nVar, n)."""
        fx = {k: np.repeat(v, n) for k, v in fixed_cols.items()}
        tiled = {k: np.tile(np.broadcast_to(np.asarray(v), (n,)), nVar) for k, v in cols.items()}
        terms = evaluate(problem, knob_grid(fx, nVar * n, **tiled), ctx).terms
        return {k: np.broadcast_to(np.asarray(v, dtype=float), (nVar * n,)).reshape(nVar, n)
                if np.ndim(v) else v for k, v in terms.items()}

    # ---------------------------------------------------------------- per layout (variant-independent)
    L0: dict[str, np.ndarray] = {}
    slots = Lyr + 2 * lay["pp_embedding_loss"]  # layer slots of the pipeline split (embedding and loss take one each)
    L0.update(layout_factors(B, slots, lay["dp"], lay["pp"]))  # A1, A2, Ls, pm2 (optimizer.model.compose)
    L0["tpcp"] = np.array([tpcp_index[tuple(int(x) for x in key)]
                           for key in zip(lay["tp"], lay["cp"], lay["ep"], lay["etp"])])
    L0["tp1"] = (lay["tp"] == 1).astype(np.int64)
    edp = lay["tp"] * lay["cp"] * lay["dp"] // (lay["ep"] * lay["etp"])
    L0["dpg1"] = ((lay["dp"] * lay["cp"] == 1) & (edp == 1)).astype(np.int64)
    L0["ppgt1"] = (lay["pp"] > 1).astype(np.int64)
    L0["hc"] = L0["ppgt1"] + lay["pp_embedding_loss"]  # head column: pp = 1; pp > 1; pp > 1 with embedding/loss slots
    # ---------------------------------------------------------------- per layout, per variant
    r = run(nL, **lay)
    Lv: list[dict[str, np.ndarray]] = [dict(L0) for _ in range(nVar)]
    bkt = r["bucket"]
    for j in range(nVar):
        Lt = Lv[j]
        Lt["AR"], Lt["RS"], Lt["AG"] = t_int(r["AR"][j]), t_int(r["RS"][j]), t_int(r["AG"][j])
        Lt["ARb"], Lt["RSb"], Lt["AGb"] = (t_int(r[x][j] * bkt[j]) for x in ("AR", "RS", "AG"))
        Lt["F"] = t_int(fsdp_traffic(r["AG"][j], r["RS"][j]))
        Lt["Fb"] = t_int(fsdp_traffic(r["AG"][j], r["RS"][j]) * bkt[j])
        Lt["reserved"] = kib_up(r["reserved"][j])
        Lt["PA"], Lt["PR"], Lt["PG"] = t_int(r["fsdp_ar"][j]), t_int(r["fsdp_red"][j]), t_int(r["fsdp_gat"][j])
    for z in vals["zero"]:
        rz = run(nL, **lay, zero=z)
        for j in range(nVar):
            Lv[j][f"opt{z}"] = t_int(rz["optimizer"][j])
            Lv[j][f"wgo{z}"] = kib_up(rz["wgo"][j])
            Lv[j][f"off{z}"] = kib_up(rz["off_state"][j])
    pu_tiers = [float(n.processor_usage) for n in problem.system.networks]

    # ---------------------------------------------------------------- per (layout, vpp) and (layout, mb)
    nV, nM = len(vals["vpp"]), len(vals["mb"])
    pp2 = np.repeat(lay["pp"], nV)
    dp2 = np.repeat(lay["dp"], nV)
    v2 = np.tile(np.array(vals["vpp"]), nL)
    sl2 = np.repeat(slots, nV)
    okv = (sl2 % (pp2 * v2)) == 0  # rows of illegal (layout, vpp) are zero (never read by a legal triple)
    LV = {"v": v2} | {k: np.where(okv, x, 0) for k, x in vpp_factors(B, sl2, dp2, pp2, v2).items()}
    ppm = np.repeat(lay["pp"], nM)
    dpm = np.repeat(lay["dp"], nM)
    m2 = np.tile(np.array(vals["mb"]), nL)
    okm = (B % (dpm * m2)) == 0
    LM = {k: np.where(okm, x, 0) for k, x in mb_factors(B, np.repeat(slots, nM), dpm, ppm, m2).items()}
    legal_all = np.stack([c.triples[:, 0], np.searchsorted(vals["vpp"], c.triples[:, 1]),
                          np.searchsorted(vals["mb"], c.triples[:, 2])], axis=1)

    # ---------------------------------------------------------------- per block beta, per variant
    shape = (len(tpcp), nM, len(vals["recompute"]), len(vals["sp"]), len(vals["tp_overlap"]))
    nB = int(np.prod(shape))
    nT = len(problem.system.networks)
    tiers_pp = sorted(set(int(x) for x in lay["tier_pp"]))
    ti, mi, ri, si, oi = (a.reshape(-1) for a in np.indices(shape))
    grp = np.array(tpcp, dtype=np.int64)[ti]
    _, first = np.unique(L0["tpcp"], return_index=True)  # a layout of each block group (its tiers are the group's)
    tier_of_grp = {ax: lay[f"tier_{ax}"][first][ti] for ax in ("tp", "cp", "ep")}
    mb_b = np.array(vals["mb"])[mi]
    cols = dict(tp=grp[:, 0], cp=grp[:, 1], ep=grp[:, 2], etp=grp[:, 3], micro_batch=mb_b,
                recompute=np.array(vals["recompute"])[ri], sequence_parallel=np.array(vals["sp"])[si],
                tp_overlap=np.array(vals["tp_overlap"])[oi], tier_tp=tier_of_grp["tp"], tier_cp=tier_of_grp["cp"],
                tier_ep=tier_of_grp["ep"])
    rb = run(nB, **cols, pp=1)
    rps = {tpp: run(nB, **cols, pp=2, tier_pp=tpp) for tpp in tiers_pp}
    rpe = {tpp: run(nB, **cols, pp=2, pp_embedding_loss=1, tier_pp=tpp) for tpp in tiers_pp} if lay["pp_embedding_loss"].any() else None
    cap = int(np.floor(capacity_bytes(problem) / KIB))
    off_cap = int(np.floor(problem.system.offload.capacity_gib * 2.0**30 / KIB))
    n_other = np.array([int(np.prod([len(vs) for _, vs in per])) for per in c.other], dtype=np.int64)
    cand = np.bincount(c.triples[:, 0], minlength=nL) * n_other
    out = []
    for j, v in enumerate(allv):
        BETA: dict[str, np.ndarray] = {}
        BETA["tau"] = t_int(rb["tau"][j])
        BETA["tau_mb"] = t_int(rb["tau"][j] / mb_b)
        BETA["fwt"], BETA["bwt"] = t_int(rb["fwt"][j]), t_int(rb["bwt"][j])
        BETA["fbt"] = t_int(rb["fwt"][j] + rb["bwt"][j])
        BETA["stored"], BETA["working"] = kib_up(rb["stored"][j]), kib_up(rb["working"][j])
        BETA["embout"], BETA["logits"] = kib_up(rb["emb_out"][j]), kib_up(rb["logits"][j])
        BETA["offx_mb"] = t_int(rb["off_layer"][j] / mb_b)
        # head column (hc) x PP tier: the edge stage's LM head and loss per micro-batch (hc: pp = 1; pp > 1; pp > 1
        # with the embedding and loss as layer slots); the exchange it hides is taken off per pair
        head = np.zeros((nB, 3, nT), dtype=np.int64)
        head[:, 0, :] = t_int(rb["head"][j])[:, None]
        p2p = np.zeros((nB, nT), dtype=np.int64)
        for tpp, rp in rps.items():
            head[:, 1, tpp] = t_int(rp["head"][j])
            if rpe is not None:
                head[:, 2, tpp] = t_int(rpe[tpp]["head"][j])
            p2p[:, tpp] = t_int(rp["t_p2p"][j])
        BETA["head"], BETA["p2p"] = head.reshape(-1), p2p.reshape(-1)
        BETA["p2p_window"] = BETA["fwt"]  # one layer's forward per micro-batch: x Lc, the chunk an exchange hides under
        Lt = Lv[j]
        LVj = dict(LV, ARv=t_int(np.repeat(r["AR"][j], nV) / v2), RSv=t_int(np.repeat(r["RS"][j], nV) / v2))
        legal = legal_all[admits[j][legal_all[:, 0]]]
        out.append(Tables(problem, lay, Lt, vals["vpp"], vals["mb"], vals["recompute"], vals["sp"],
                          vals["tp_overlap"], vals["zero"], vals["dp_overlap"], tpcp, LVj, LM, BETA, legal, cap,
                          c.size, dict(v), pu_tiers, off_cap, j, cand))
    return out
