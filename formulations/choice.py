"""Decision variables and the integer rules that tie them (constraint group ``rules.*``).

Variables are indices into the tables of `formulations.tables`: layout l (tp, pp, dp, cp and placement,
with tp*pp*dp*cp = N, heads/kv/ffn divisible by tp, pp dividing the layers already true of every layout),
vpp index, micro-batch index, recompute, SP, TP overlap, ZeRO stage and DP overlap. The legal
(layout, vpp, micro-batch) triples (layers divisible by pp*vpp, global batch by dp*micro_batch, micro-batches
a multiple of pp when interleaved) are one table constraint.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from .common import Lookups, index_literals
from .tables import Tables


@dataclass
class ChoiceVars:
    l: cp_model.IntVar
    vi: cp_model.IntVar
    mi: cp_model.IntVar
    ri: cp_model.IntVar
    si: cp_model.IntVar
    oi: cp_model.IntVar
    zi: cp_model.IntVar
    di: cp_model.IntVar
    lv: cp_model.IntVar  # l * nV + vi
    lm: cp_model.IntVar  # l * nM + mi
    beta: cp_model.IntVar  # block index
    z_lits: list
    dpo_on: cp_model.IntVar  # bool: DP overlap
    ppgt1: cp_model.IntVar
    v1: cp_model.IntVar | None  # bool: vpp == 1
    by_l: Lookups  # tables indexed by layout
    by_lv: Lookups  # ... by layout+vpp
    by_lm: Lookups  # ... by layout+micro-batch
    by_beta: Lookups  # ... by block
    by_beta_head: Lookups  # ... by block and pp > 1
    by_beta_tier: Lookups  # ... by block and the tier of pp
    lower: cp_model.IntVar  # lower bound of the objective for the chosen triple (bounds.triple)

    def close(self, T: Tables) -> None:
        """Post every lookup table (after all modules asked for their columns)."""
        self.by_l.close()
        self.by_lv.close(sorted({li * T.nV + vi for li, vi, _ in T.legal_lvm}))
        self.by_lm.close(sorted({li * T.nM + mi for li, _, mi in T.legal_lvm}))
        self.by_beta.close()
        self.by_beta_head.close()
        self.by_beta_tier.close()

    def extract(self, solver: cp_model.CpSolver) -> dict[str, int]:
        return {n: int(solver.Value(getattr(self, n))) for n in ("l", "vi", "mi", "ri", "si", "oi", "zi", "di")}

    def key(self) -> list:
        return [self.l, self.vi, self.mi, self.ri, self.si, self.oi, self.zi, self.di]


def build(T: Tables, m: cp_model.CpModel) -> ChoiceVars:
    nL = len(T.lay["tp"])
    nV, nM = T.nV, T.nM
    nR, nS, nO = len(T.rec_vals), len(T.sp_vals), len(T.ov_vals)
    l = m.NewIntVar(0, nL - 1, "layout")
    vi = m.NewIntVar(0, nV - 1, "vpp_index")
    mi = m.NewIntVar(0, nM - 1, "micro_batch_index")
    ri = m.NewIntVar(0, nR - 1, "recompute_index")
    si = m.NewIntVar(0, nS - 1, "sp_index")
    oi = m.NewIntVar(0, nO - 1, "tp_overlap_index")
    zi = m.NewIntVar(0, len(T.z_vals) - 1, "zero_index")
    di = m.NewIntVar(0, len(T.dpo_vals) - 1, "dp_overlap_index")
    from .bounds import triple_bounds

    triples, lb = triple_bounds(T)  # legal triples that can fit, and a lower bound of the objective
    lower = m.NewIntVarFromDomain(cp_model.Domain.FromValues(sorted(set(int(x) for x in lb)) or [0]),
                                  "bounds.triple")
    # rules.batch_and_layers + bounds: (layout, vpp, micro-batch) legal and able to fit
    m.AddAllowedAssignments([l, vi, mi, lower], [[a, b, c, int(x)] for (a, b, c), x in zip(triples, lb)])
    lv = m.NewIntVar(0, nL * nV - 1, "layout_vpp")
    m.Add(lv == l * nV + vi)
    lm = m.NewIntVar(0, nL * nM - 1, "layout_micro_batch")
    m.Add(lm == l * nM + mi)
    by_l = Lookups(m, l, nL, "layout")
    tpcp = by_l.get("tpcp", T.L["tpcp"])
    nB = len(T.tpcp) * nM * nR * nS * nO
    beta = m.NewIntVar(0, nB - 1, "block")
    m.Add(beta == (((tpcp * nM + mi) * nR + ri) * nS + si) * nO + oi)
    # rules.tp1: no SP and no TP overlap without a TP group
    tp1 = m.NewBoolVar("tp==1")
    m.Add(tp1 == by_l.get("tp1", T.L["tp1"]))
    for j, v in enumerate(T.sp_vals):
        if v != 0:
            m.Add(si != j).OnlyEnforceIf(tp1)
    for j, v in enumerate(T.ov_vals):
        if v != 0:
            m.Add(oi != j).OnlyEnforceIf(tp1)
    # rules.dp1: no ZeRO and overlap flag on without a data-parallel group (as the space does)
    dpg1 = m.NewBoolVar("dp*cp==1")
    m.Add(dpg1 == by_l.get("dpg1", T.L["dpg1"]))
    for j, z in enumerate(T.z_vals):
        if z != 0:
            m.Add(zi != j).OnlyEnforceIf(dpg1)
    dpo_on = m.NewBoolVar("dp_overlap")
    m.AddElement(di, [int(v) for v in T.dpo_vals], dpo_on)
    if 1 in T.dpo_vals:
        m.AddImplication(dpg1, dpo_on)
    z_lits = index_literals(m, zi, len(T.z_vals), "zero_index")
    ppgt1 = m.NewBoolVar("pp>1")
    m.Add(ppgt1 == by_l.get("ppgt1", T.L["ppgt1"]))
    v1 = None
    if 1 in T.v_vals:
        v1 = m.NewBoolVar("vpp==1")
        j1 = T.v_vals.index(1)
        m.Add(vi == j1).OnlyEnforceIf(v1)
        m.Add(vi != j1).OnlyEnforceIf(v1.Not())
    nT = len(T.problem.system.networks)
    bh = m.NewIntVar(0, 2 * nB - 1, "block_head")
    m.Add(bh == 2 * beta + ppgt1)
    t_pp = by_l.get("tier_pp", T.lay["tier_pp"])
    bp = m.NewIntVar(0, nT * nB - 1, "block_tier_pp")
    m.Add(bp == nT * beta + t_pp)
    out = ChoiceVars(l, vi, mi, ri, si, oi, zi, di, lv, lm, beta, z_lits, dpo_on, ppgt1, v1, by_l,
                      Lookups(m, lv, nL * nV, "layout_vpp"), Lookups(m, lm, nL * nM, "layout_mb"),
                      Lookups(m, beta, nB, "block"), Lookups(m, bh, 2 * nB, "block_head"),
                      Lookups(m, bp, nT * nB, "block_tier"), lower)
    return out
