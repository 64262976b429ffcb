"""Memory capacities, in KiB, usage rounded up and capacity down.

``memory.hbm``:
    weights + gradients + optimizer state (ZeRO stage z, worst stage)   state >= state_hbm_bytes_z{z}[p]
    + activations of the worst pipeline stage + runtime reserve          act[p] (formulations.pairs)
    <= HBM - headroom
``memory.offload`` (when some kept pair offloads):
    offloaded weights/gradients/optimizer state  off_state >= state_offload_bytes_z{z}[p]
    + offloaded activations                      offact[p]
    <= offload memory per GPU
Each group is guarded by a literal (`enforce`, `enforce_offload`), so `check` can name it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formulations.choice import ChoiceVars
from formulations.cp_sat import cp_model
from formulations.tables import Tables


@dataclass
class MemoryVars:
    state: cp_model.IntVar
    enforce: cp_model.IntVar  # the literal guarding memory.hbm (for explanations)
    enforce_offload: cp_model.IntVar | None = None  # ... memory.offload (None: nothing is offloaded)


def build(T: Tables, m: cp_model.CpModel, c: ChoiceVars) -> MemoryVars:
    enforce = m.NewBoolVar("memory.hbm")
    state = m.NewIntVar(0, 2**62 // 4, "memory.state")
    for j, z in enumerate(T.z_vals):
        m.Add(state >= c.col(f"state_hbm_bytes_z{z}")).OnlyEnforceIf(c.z_lits[j])
    m.Add(state + c.col("act") <= T.cap_kib).OnlyEnforceIf(enforce)
    cols = c.pre.cols
    offloads = any(np.any(cols[f"state_offload_bytes_z{z}"] != 0) for z in T.z_vals)
    if not offloads and not np.any(cols["offact"] != 0):
        return MemoryVars(state, enforce)
    enf_off = m.NewBoolVar("memory.offload")
    off_state = m.NewIntVar(0, 2**62 // 4, "memory.offload_state")
    for j, z in enumerate(T.z_vals):
        m.Add(off_state >= c.col(f"state_offload_bytes_z{z}")).OnlyEnforceIf(c.z_lits[j])
    m.Add(off_state + c.col("offact") <= T.off_cap_kib).OnlyEnforceIf(enf_off)
    return MemoryVars(state, enforce, enf_off)
