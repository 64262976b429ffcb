"""The objective: the model's step time (constraint group ``time``), in TIME_UNIT.

    step = pipeline[p]                       (layers, LM head, bubble, p2p, offload: formulations.pairs)
         + y_dp >= link_z[p]                 without DP overlap
           Q*y_dp >= pu*link_z + (Q-pu)*exp_z  with overlap (exposed traffic + processor-usage slowdown)
         + y_opt >= opt_z[p]                 optimizer step of ZeRO stage z
as `optimizer.model.step` composes it; for piecewise costs while minimising, y >= f(x) suffices.
"""

from __future__ import annotations

from dataclasses import dataclass

from formulations.choice import ChoiceVars
from formulations.cp_sat import cp_model
from formulations.pairs import Q
from formulations.tables import Tables
from optimizer.model.compose import PIPE, pipeline_sum
from optimizer.model.terms import compose_step


@dataclass
class TimeVars:
    terms: dict[str, cp_model.IntVar]
    objective: cp_model.LinearExpr


def build(T: Tables, m: cp_model.CpModel, c: ChoiceVars) -> TimeVars:
    parts = {k: c.col(k) for k in PIPE}
    big = 10**14  # 10^5 s in ns; Q * big < 2^63
    y_dp = m.NewIntVar(0, big, "time.dp")
    y_opt = m.NewIntVar(0, big, "time.optimizer")
    for j, z in enumerate(T.z_vals):
        zl = c.z_lits[j]
        m.Add(y_dp >= c.col(f"link{z}")).OnlyEnforceIf([zl, c.dpo_on.Not()])
        m.Add(Q * y_dp >= c.col(f"ovl{z}")).OnlyEnforceIf([zl, c.dpo_on])
        m.Add(y_opt >= c.col(f"opt{z}")).OnlyEnforceIf(zl)
    # the DP variable holds exposure and overlap slowdown, the optimizer column FSDP's copies (`compose_step`)
    objective = compose_step(pipeline_sum(parts), y_dp, 0, y_opt, 0)
    return TimeVars(parts | {"dp": y_dp, "optimizer": y_opt}, objective)
