"""Decision variables and the integer rules that tie them (constraint group ``rules.*``).

The structural knobs are decided by one variable, the *pair* p: a legal (layout, vpp, micro-batch) triple
(tp*pp*dp*cp = N or <= N with idle GPUs, heads/kv/ffn divisible by tp, layers by pp*vpp, global batch by
dp*micro_batch, micro-batches a multiple of pp when interleaved, network tiers filled and large enough)
times one block setting (recompute, SP, TP overlap; no SP / TP overlap without a TP group), less what
`formulations.bounds` proved cannot fit or cannot be optimal. Every term that depends on the pair only is
a column of one table constraint over p (`Lookups`, formulations.pairs). The ZeRO stage (none when there is
no data-parallel group) and DP overlap (moot, so on, without one) are free decisions on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formulations.bounds import Presolved
from formulations.common import Lookups, index_literals
from formulations.cp_sat import cp_model
from formulations.tables import Tables
from optimizer.rules.layout import zero_allowed
from optimizer.schema.stack import overlaps_pipelined_dp

KEYS = ("li", "vi", "mi", "ri", "si", "oi", "var")


@dataclass
class ChoiceVars:
    pair: cp_model.IntVar  # index into the kept pairs
    zi: cp_model.IntVar  # ZeRO stage index
    di: cp_model.IntVar  # DP overlap index
    z_lits: list  # zi == j
    dpo_on: cp_model.IntVar  # bool: DP overlap
    by_pair: Lookups  # per-pair columns (formulations.pairs)
    lower: cp_model.IntVar  # lower bound of the objective for the chosen pair (formulations.bounds)
    pre: Presolved

    def col(self, name: str) -> cp_model.IntVar:
        return self.by_pair.get(name, self.pre.cols[name])

    def close(self) -> None:
        """Post the pair table (after all modules asked for their columns)."""
        self.by_pair.close()

    def extract(self, solver: cp_model.CpSolver) -> dict[str, int]:
        p = int(solver.Value(self.pair))
        out = {n: int(getattr(self.pre.pairs, n)[p]) for n in KEYS}
        out.update(zi=int(solver.Value(self.zi)), di=int(solver.Value(self.di)), pair=p)
        return out

    def key(self) -> list:
        return [self.pair, self.zi, self.di]


def build(T: Tables, m: cp_model.CpModel, pre: Presolved) -> ChoiceVars:
    P = pre.pairs
    n = len(P)
    pair = m.NewIntVar(0, n - 1, "pair")
    zi = m.NewIntVar(0, len(T.z_vals) - 1, "zero_index")
    di = m.NewIntVar(0, len(T.dpo_vals) - 1, "dp_overlap_index")
    by_pair = Lookups(m, pair, n, "pair")
    lower = by_pair.get("bounds.lower", P.slb)  # redundant cut: score >= its LB for the pair
    # rules.dp1: no ZeRO and overlap flag on without a data-parallel group (as the space does)
    dpg1 = m.NewBoolVar("dp*cp==1")
    m.Add(dpg1 == by_pair.get("dpg1", pre.cols["dpg1"]))
    for j, z in enumerate(T.z_vals):
        if not zero_allowed(z, no_dp_group=True):
            m.Add(zi != j).OnlyEnforceIf(dpg1)
    dpo_on = m.NewBoolVar("dp_overlap")
    m.AddElement(di, [int(v) for v in T.dpo_vals], dpo_on)
    if 1 in T.dpo_vals:
        if overlaps_pipelined_dp(T.problem.stack):
            m.AddImplication(dpg1, dpo_on)
        else:  # `layout.dp_overlap_allowed`: no overlap of a pipelined DP reduction, the moot flag off too
            piped = m.NewBoolVar("pp>1")
            m.Add(piped == by_pair.get("ppgt1", pre.cols["ppgt1"]))
            m.AddImplication(piped, dpo_on.Not())
            m.AddBoolOr([dpg1.Not(), piped, dpo_on])
    z_lits = index_literals(m, zi, len(T.z_vals), "zero_index")
    return ChoiceVars(pair, zi, di, z_lits, dpo_on, by_pair, lower, pre)


def pair_index(ch: ChoiceVars, a: dict[str, int]) -> int | None:
    """The kept pair of an assignment given by knob indices (for hints), or None."""
    P = ch.pre.pairs
    hit = np.ones(len(P), dtype=bool)
    for n in KEYS:
        hit &= getattr(P, n) == a[n]
    idx = np.nonzero(hit)[0]
    return int(idx[0]) if len(idx) else None
