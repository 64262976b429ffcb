"""Tables of the CP-SAT formulation, filled by the analytical model (never a second copy of the physics).

The step time (`optimizer.model.step`) is composed of terms that each depend on few knobs:
- per *layout* l = (tp, pp, dp, cp, placement): B*L/(dp*pp), B/dp, L/pp, the DP collectives (AR, RS,
  AG of the stage's gradients/weights), optimizer time and weight/gradient/optimizer memory per ZeRO stage;
- per *layout+vpp* lv: layers per chunk L/(pp*vpp), the overlap window factor, p2p count factors,
  in-flight layers of the interleaved schedule;
- per (layout, micro-batch) lm: micro-batches n_mb and n_mb*L/pp, in-flight layers of 1F1B;
- per *block* beta = (tp, cp, micro-batch, recompute, SP, TP overlap): per-layer time tau, forward and
  backward parts, LM-head/loss time, p2p time, stored and working activations, logits.
Each table is read from `evaluate(...).terms` on a small grid of candidates, so the numbers are the
model's own; `formulations.time` combines them with the same sums, products and maxima as
`optimizer.model.step`. Units: time in `TIME_UNIT` = 1 ns, memory in KiB (usage rounded up, capacity
rounded down: a plan the solver accepts never exceeds a capacity of the exact model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from optimizer.enumerate import capacity_bytes
from optimizer.model.knobs import Knobs
from optimizer.model.step import evaluate, make_ctx
from optimizer.schema import Problem
from optimizer.space import Compact

TIME_UNIT = 1e9  # integer time unit per second (1 ns)
KIB = 1024.0


def t_int(x) -> np.ndarray:
    return np.rint(np.asarray(x, dtype=float) * TIME_UNIT).astype(np.int64)


def kib_up(x) -> np.ndarray:
    return np.ceil(np.asarray(x, dtype=float) / KIB - 1e-9).astype(np.int64)


class Unsupported(Exception):
    """The problem uses a knob the CP-SAT formulation does not cover yet."""


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
    tpcp: list[tuple[int, int]]  # (tp, cp) combos; layout -> index
    LV: dict[str, np.ndarray]  # per (layout, v index), flattened l*nV + vi
    LM: dict[str, np.ndarray]  # per (layout, mb index), flattened l*nM + mi
    BETA: dict[str, np.ndarray]  # per block index (see beta_index)
    legal_lvm: np.ndarray  # rows: legal (l, vi, mi)
    cap_kib: int
    n_candidates: int
    fixed: dict[str, int] = field(default_factory=dict)
    pu_tiers: list[float] = field(default_factory=list)

    def gpus(self, l: np.ndarray) -> np.ndarray:
        """GPUs used by layouts l: tp*pp*dp*cp."""
        return (self.lay["tp"] * self.lay["pp"] * self.lay["dp"] * self.lay["cp"])[l]

    @property
    def nV(self) -> int:
        return len(self.v_vals)

    @property
    def nM(self) -> int:
        return len(self.mb_vals)

    def beta_shape(self) -> tuple[int, ...]:
        return (len(self.tpcp), self.nM, len(self.rec_vals), len(self.sp_vals), len(self.ov_vals))


def knob_grid(fixed: dict[str, int], n: int, **cols) -> Knobs:
    """n candidates: the given columns, the fixed knobs, everything else at its neutral value."""
    base = dict(tp=1, pp=1, dp=1, cp=1, ep=1, vpp=1, mb=1, recompute=0, sp=0, sp_redo=fixed["sp_redo"],
                tp_overlap=0, pp_rs_ag=fixed["pp_rs_ag"], dp_overlap=0, zero=0, fused=fixed["fused"],
                flash=fixed["flash"], gpipe=fixed["gpipe"], w_off=0, a_off=0, o_off=0, tier_tp=0, tier_cp=0,
                tier_ep=0, tier_dp=0, tier_pp=0)
    base.update(cols)
    base["rs_ag"] = base["sp"]
    base["etp"] = base["tp"]
    return Knobs(**{k: np.broadcast_to(np.asarray(v, dtype=np.int64), (n,)).copy() for k, v in base.items()})


def build_tables(problem: Problem, c: Compact) -> Tables:
    if c.size == 0:
        raise Unsupported("empty space")
    union: dict[str, set[int]] = {}
    multi: set[str] = set()
    seen: set[int] = set()
    for per in c.other:  # layouts share a few distinct lists: look at each once
        if id(per) in seen:
            continue
        seen.add(id(per))
        for n, vs in per:
            union.setdefault(n, set()).update(vs)
            if len(vs) > 1:
                multi.add(n)
    fixed = {}
    other_of = {"fused_layers": "fused", "attention": "flash", "sp_ag_redo": "sp_redo", "pp_rs_ag": "pp_rs_ag",
                "schedule": "gpipe", "weight_offload": "w_off", "activation_offload": "a_off",
                "optimizer_offload": "o_off"}
    for name, short in other_of.items():
        if name in multi:
            raise Unsupported(f"knob '{name}' with several values is not in the CP-SAT formulation yet")
        fixed[short] = sorted(union[name])[0]
    nL = len(c.layouts)
    lay = {n: np.array([lt[i] for lt in c.layouts]) for i, n in enumerate(("tp", "pp", "cp", "dp"))}
    for ax in ("tp", "cp", "dp", "pp"):
        lay[f"tier_{ax}"] = np.array([t[ax] for t in c.tiers])

    def dom_codes(name):
        return sorted(union[name])

    vals = {"vpp": np.unique(c.triples[:, 1]).tolist(), "mb": np.unique(c.triples[:, 2]).tolist(),
            "recompute": dom_codes("recompute"), "sp": dom_codes("sequence_parallel"),
            "tp_overlap": dom_codes("tp_overlap"), "zero": dom_codes("zero"), "dp_overlap": dom_codes("dp_overlap")}
    tpcp = sorted({(int(a), int(b)) for a, b in zip(lay["tp"], lay["cp"])})
    tpcp_index = {x: i for i, x in enumerate(tpcp)}
    ctx = make_ctx(problem)
    llm = problem.llm
    B, Lyr = problem.training.global_batch, llm.layers

    def grid(n: int, **cols) -> Knobs:
        return knob_grid(fixed, n, **cols)

    # ---------------------------------------------------------------- per layout
    Lt: dict[str, np.ndarray] = {}
    lk = grid(nL, **{k: v for k, v in lay.items()})
    r = evaluate(problem, lk, ctx).terms
    Lt["A1"] = (B * Lyr) // (lay["dp"] * lay["pp"])  # n_mb * Ls * mb
    Lt["A2"] = B // lay["dp"]  # n_mb * mb
    Lt["Ls"] = Lyr // lay["pp"]
    Lt["pm2"] = 2 * (lay["pp"] - 1)
    Lt["AR"], Lt["RS"], Lt["AG"] = t_int(r["AR"]), t_int(r["RS"]), t_int(r["AG"])
    bkt = r["bucket"]
    Lt["ARb"], Lt["RSb"], Lt["AGb"] = t_int(r["AR"] * bkt), t_int(r["RS"] * bkt), t_int(r["AG"] * bkt)
    Lt["F"] = t_int(2.0 * r["AG"] + r["RS"])
    Lt["Fb"] = t_int((2.0 * r["AG"] + r["RS"]) * bkt)
    Lt["tpcp"] = np.array([tpcp_index[(int(a), int(b))] for a, b in zip(lay["tp"], lay["cp"])])
    Lt["tp1"] = (lay["tp"] == 1).astype(np.int64)
    Lt["dpg1"] = (lay["dp"] * lay["cp"] == 1).astype(np.int64)
    Lt["ppgt1"] = (lay["pp"] > 1).astype(np.int64)
    for z in vals["zero"]:
        rz = evaluate(problem, lk.replace(zero=np.full(nL, z)), ctx).terms
        Lt[f"opt{z}"] = t_int(rz["optimizer"])
        Lt[f"wgo{z}"] = kib_up(rz["wgo"])
    Lt["reserved"] = kib_up(r["reserved"])
    pu_tiers = [float(n.processor_usage) for n in problem.system.networks]

    # ---------------------------------------------------------------- per (layout, vpp) and (layout, mb)
    nV, nM = len(vals["vpp"]), len(vals["mb"])
    pp2 = np.repeat(lay["pp"], nV)
    dp2 = np.repeat(lay["dp"], nV)
    v2 = np.tile(np.array(vals["vpp"]), nL)
    okv = (Lyr % (pp2 * v2)) == 0
    lc = np.where(okv, Lyr // (pp2 * v2), 0)
    LV = {"v": v2, "Lc": lc, "Wm": lc * (1 + (v2 - 1) * pp2), "E": np.where(pp2 > 1, 2 * B * v2 // dp2, 0),
          "Bf": lc * (pp2 - 1), "inflv": lc * (pp2 * (v2 + 1) - 1),
          "ARv": t_int(np.repeat(r["AR"], nV) / v2), "RSv": t_int(np.repeat(r["RS"], nV) / v2)}
    ppm = np.repeat(lay["pp"], nM)
    dpm = np.repeat(lay["dp"], nM)
    m2 = np.tile(np.array(vals["mb"]), nL)
    okm = (B % (dpm * m2)) == 0
    nmb = np.where(okm, B // (dpm * m2), 0)
    LM = {"nmb": nmb, "NL": nmb * (Lyr // ppm), "infl1": (Lyr // ppm) * np.minimum(nmb, ppm)}
    legal = np.stack([c.triples[:, 0], np.searchsorted(vals["vpp"], c.triples[:, 1]),
                      np.searchsorted(vals["mb"], c.triples[:, 2])], axis=1)

    # ---------------------------------------------------------------- per block beta
    shape = (len(tpcp), nM, len(vals["recompute"]), len(vals["sp"]), len(vals["tp_overlap"]))
    nB = int(np.prod(shape))
    nT = len(problem.system.networks)
    tiers_pp = sorted(set(int(x) for x in lay["tier_pp"]))
    ti, mi, ri, si, oi = (a.reshape(-1) for a in np.indices(shape))
    tp_b = np.array([tpcp[i][0] for i in ti])
    cp_b = np.array([tpcp[i][1] for i in ti])
    first_l = {x: int(np.nonzero((lay["tp"] == x[0]) & (lay["cp"] == x[1]))[0][0]) for x in tpcp}
    ttp = np.array([lay["tier_tp"][first_l[tpcp[i]]] for i in ti])
    tcp = np.array([lay["tier_cp"][first_l[tpcp[i]]] for i in ti])
    mb_b = np.array(vals["mb"])[mi]
    cols = dict(tp=tp_b, cp=cp_b, mb=mb_b, recompute=np.array(vals["recompute"])[ri],
                sp=np.array(vals["sp"])[si], tp_overlap=np.array(vals["tp_overlap"])[oi], tier_tp=ttp, tier_cp=tcp)
    BETA: dict[str, np.ndarray] = {}
    rb = evaluate(problem, grid(nB, **cols, pp=1), ctx).terms
    BETA["tau"] = t_int(rb["tau"])
    BETA["tau_mb"] = t_int(rb["tau"] / mb_b)
    BETA["fwt"], BETA["bwt"] = t_int(rb["fwt"]), t_int(rb["bwt"])
    BETA["fbt"] = t_int(rb["fwt"] + rb["bwt"])
    BETA["stored"], BETA["working"] = kib_up(rb["stored"]), kib_up(rb["working"])
    BETA["embout"], BETA["logits"] = kib_up(rb["emb_out"]), kib_up(rb["logits"])
    head = np.zeros((nB, 2), dtype=np.int64)
    head[:, 0] = t_int(rb["head"] / mb_b)
    p2p_mb = np.zeros((nB, nT), dtype=np.int64)
    p2p = np.zeros((nB, nT), dtype=np.int64)
    for tpp in tiers_pp:
        rp = evaluate(problem, grid(nB, **cols, pp=2, tier_pp=tpp), ctx).terms
        head[:, 1] = t_int(rp["head"] / mb_b)
        p2p_mb[:, tpp] = t_int(rp["t_p2p"] / mb_b)
        p2p[:, tpp] = t_int(rp["t_p2p"])
    BETA["head_mb"], BETA["p2p_mb"], BETA["p2p"] = head.reshape(-1), p2p_mb.reshape(-1), p2p.reshape(-1)
    cap = int(np.floor(capacity_bytes(problem) / KIB))
    return Tables(problem, lay, Lt, vals["vpp"], vals["mb"], vals["recompute"], vals["sp"], vals["tp_overlap"],
                  vals["zero"], vals["dp_overlap"], tpcp, LV, LM, BETA, legal, cap, c.size, fixed, pu_tiers)
