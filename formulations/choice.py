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

from .common import index_literals, lookup
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
    m.AddAllowedAssignments([l, vi, mi], T.legal_lvm)  # rules.batch_and_layers
    lv = m.NewIntVar(0, nL * nV - 1, "layout_vpp")
    m.Add(lv == l * nV + vi)
    lm = m.NewIntVar(0, nL * nM - 1, "layout_micro_batch")
    m.Add(lm == l * nM + mi)
    tpcp = lookup(m, l, T.L["tpcp"], "tp_cp_index")
    beta = m.NewIntVar(0, len(T.tpcp) * nM * nR * nS * nO - 1, "block")
    m.Add(beta == (((tpcp * nM + mi) * nR + ri) * nS + si) * nO + oi)
    # rules.tp1: no SP and no TP overlap without a TP group
    tp1 = m.NewBoolVar("tp==1")
    m.AddElement(l, [int(x) for x in T.L["tp1"]], tp1)
    for j, v in enumerate(T.sp_vals):
        if v != 0:
            m.Add(si != j).OnlyEnforceIf(tp1)
    for j, v in enumerate(T.ov_vals):
        if v != 0:
            m.Add(oi != j).OnlyEnforceIf(tp1)
    # rules.dp1: no ZeRO and overlap flag on without a data-parallel group (as the space does)
    dpg1 = m.NewBoolVar("dp*cp==1")
    m.AddElement(l, [int(x) for x in T.L["dpg1"]], dpg1)
    for j, z in enumerate(T.z_vals):
        if z != 0:
            m.Add(zi != j).OnlyEnforceIf(dpg1)
    dpo_on = m.NewBoolVar("dp_overlap")
    m.AddElement(di, [int(v) for v in T.dpo_vals], dpo_on)
    if 1 in T.dpo_vals:
        m.AddImplication(dpg1, dpo_on)
    z_lits = index_literals(m, zi, len(T.z_vals), "zero_index")
    ppgt1 = m.NewBoolVar("pp>1")
    m.AddElement(l, [int(x) for x in T.L["ppgt1"]], ppgt1)
    v1 = None
    if 1 in T.v_vals:
        v1 = m.NewBoolVar("vpp==1")
        j1 = T.v_vals.index(1)
        m.Add(vi == j1).OnlyEnforceIf(v1)
        m.Add(vi != j1).OnlyEnforceIf(v1.Not())
    return ChoiceVars(l, vi, mi, ri, si, oi, zi, di, lv, lm, beta, z_lits, dpo_on, ppgt1, v1)
