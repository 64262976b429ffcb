"""HBM capacity (constraint group ``memory.hbm``), in KiB, usage rounded up and capacity down.

    weights + gradients + optimizer state (ZeRO stage z, worst stage)   state >= wgo_z[p]
    + activations of the worst pipeline stage + runtime reserve          act[p] (formulations.pairs)
    <= HBM - headroom
The group is guarded by the literal `enforce`, so `check` can name it in an explanation.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from .choice import ChoiceVars
from .tables import Tables


@dataclass
class MemoryVars:
    state: cp_model.IntVar
    enforce: cp_model.IntVar  # the literal guarding memory.hbm (for explanations)

    def extract(self, solver: cp_model.CpSolver) -> dict[str, int]:
        return {"state_kib": int(solver.Value(self.state))}


def build(T: Tables, m: cp_model.CpModel, c: ChoiceVars) -> MemoryVars:
    enforce = m.NewBoolVar("memory.hbm")
    state = m.NewIntVar(0, 2**62 // 4, "memory.state")
    for j, z in enumerate(T.z_vals):
        m.Add(state >= c.col(f"wgo{z}")).OnlyEnforceIf(c.z_lits[j])
    m.Add(state + c.col("act") <= T.cap_kib).OnlyEnforceIf(enforce)
    return MemoryVars(state, enforce)
