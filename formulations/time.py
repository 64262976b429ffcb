"""The objective: the model's step time, composed from the tables exactly as `optimizer.model.step` does.

    step = n_mb*Ls*tau + n_mb*head                  = A1[l]*tau_mb[beta] + A2[l]*head_mb[beta, pp>1]
         + (pp-1)/vpp*Ls*tau (bubble)               = Bf[lv]*tau[beta]
         + 2*(n_mb*vpp + pp-1)*t_p2p                = E[lv]*p2p_mb[beta, tier_pp] + 2(pp-1)[l]*p2p[beta, tier_pp]
         + DP exposed + DP slowdown                 (per ZeRO stage and overlap, below)
         + optimizer                                = opt_z[l]
Data-parallel traffic: without overlap the link time of the ZeRO stage; with overlap
(1 - pu)*exposed + pu*link, where exposed is the model's maximum of its terms, written as y >= each
term (the objective pushes y down to the maximum). All times are integers in TIME_UNIT.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from .choice import ChoiceVars
from .common import product
from .tables import Tables

Q = 10_000  # fixed-point scale of the processor-usage fractions


@dataclass
class TimeVars:
    terms: dict[str, cp_model.IntVar]
    objective: cp_model.LinearExpr

    def extract(self, solver: cp_model.CpSolver) -> dict[str, int]:
        return {k: int(solver.Value(v)) for k, v in self.terms.items()}


def build(T: Tables, m: cp_model.CpModel, c: ChoiceVars) -> TimeVars:
    Lt, LV, LM, BE = T.L, T.LV, T.LM, T.BETA
    bl, blv, blm, bb = c.by_l, c.by_lv, c.by_lm, c.by_beta
    A1, A2 = bl.get("A1", Lt["A1"]), bl.get("A2", Lt["A2"])
    tau_mb, tau = bb.get("tau_mb", BE["tau_mb"]), bb.get("tau", BE["tau"])
    head_mb = c.by_beta_head.get("head_mb", BE["head_mb"])
    p2p_mb, p2p = c.by_beta_tier.get("p2p_mb", BE["p2p_mb"]), c.by_beta_tier.get("p2p", BE["p2p"])
    X1 = product(m, A1, tau_mb, "pipe_layers")
    X2 = product(m, A2, head_mb, "pipe_head")
    Xb = product(m, blv.get("Bf", LV["Bf"]), tau, "bubble")
    Xp = product(m, blv.get("E", LV["E"]), p2p_mb, "p2p_steady")
    Xf = product(m, bl.get("pm2", Lt["pm2"]), p2p, "p2p_fill")

    # ---------------------------------------------------------------- data-parallel traffic
    AR, RS, AG = (bl.get(n, Lt[n]) for n in ("AR", "RS", "AG"))
    ARb, RSb, AGb = (bl.get(n, Lt[n]) for n in ("ARb", "RSb", "AGb"))
    F, Fb = bl.get("F", Lt["F"]), bl.get("Fb", Lt["Fb"])
    ARv, RSv = blv.get("ARv", LV["ARv"]), blv.get("RSv", LV["RSv"])
    nmb, NL = blm.get("nmb", LM["nmb"]), blm.get("NL", LM["NL"])
    Ls = bl.get("Ls", Lt["Ls"])
    fwt, bwt, fbt = (bb.get(n, BE[n]) for n in ("fwt", "bwt", "fbt"))
    t_cb = product(m, blv.get("Lc", LV["Lc"]), bwt, "t_cb")
    W = product(m, blv.get("Wm", LV["Wm"]), bwt, "window")
    Lfw = product(m, Ls, fwt, "Ls_fw")
    NLbw, NLfb = product(m, NL, bwt, "nLs_bw"), product(m, NL, fbt, "nLs_fbw")
    nRS, nRSb = product(m, nmb, RS, "nmb_RS"), product(m, nmb, RSb, "nmb_RSb")
    nF, nFb = product(m, nmb, F, "nmb_F"), product(m, nmb, Fb, "nmb_Fb")
    big = 10**14  # 10^5 s in ns; Q * big < 2^63
    links = {0: AR, 1: RS + AG, 2: nRS + AG, 3: nF}
    E = {}
    e0 = m.NewIntVar(0, big, "exp_z0")
    m.Add(e0 >= ARb), m.Add(e0 >= ARv - t_cb), m.Add(e0 >= AR - W)
    eg = m.NewIntVar(0, big, "exp_grad_z1")
    m.Add(eg >= RSb), m.Add(eg >= RSv - t_cb), m.Add(eg >= RS - W)
    ea = m.NewIntVar(0, big, "exp_gather")
    m.Add(ea >= AGb), m.Add(ea >= AG - Lfw)
    eg2 = m.NewIntVar(0, big, "exp_grad_z2")
    m.Add(eg2 >= nRSb), m.Add(eg2 >= nRS - NLbw)
    e3 = m.NewIntVar(0, big, "exp_z3")
    m.Add(e3 >= nFb), m.Add(e3 >= nF - NLfb)
    E = {0: e0, 1: eg + ea, 2: eg2 + ea, 3: e3}
    y_dp = m.NewIntVar(0, big, "dp_time")
    t_dp = bl.get("tier_dp", T.lay["tier_dp"])
    tier_lits = {}
    for t in sorted(set(int(x) for x in T.lay["tier_dp"])):
        b = m.NewBoolVar(f"tier_dp=={t}")
        m.Add(t_dp == t).OnlyEnforceIf(b)
        m.Add(t_dp != t).OnlyEnforceIf(b.Not())
        tier_lits[t] = b
    for j, z in enumerate(T.z_vals):
        zl = c.z_lits[j]
        m.Add(y_dp >= links[z]).OnlyEnforceIf([zl, c.dpo_on.Not()])
        for t, tl in tier_lits.items():
            pu = int(round(T.pu_tiers[t] * Q))
            m.Add(Q * y_dp >= pu * links[z] + (Q - pu) * E[z]).OnlyEnforceIf([zl, c.dpo_on, tl])

    # ---------------------------------------------------------------- optimizer
    y_opt = m.NewIntVar(0, big, "optimizer")
    for j, z in enumerate(T.z_vals):
        m.Add(y_opt >= bl.get(f"opt{z}", Lt[f"opt{z}"])).OnlyEnforceIf(c.z_lits[j])

    terms = dict(pipe_layers=X1, pipe_head=X2, bubble=Xb, p2p_steady=Xp, p2p_fill=Xf, dp=y_dp, optimizer=y_opt)
    return TimeVars(terms, sum(terms.values()))
