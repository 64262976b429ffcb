"""HBM capacity (constraint group ``memory.hbm``), in KiB, usage rounded up and capacity down.

    weights + gradients + optimizer state (per ZeRO stage, of the worst stage)
    + max(activations of the first stage, of the last stage) + runtime reserve <= HBM - headroom
first stage: in-flight layers x stored activations per layer + working set + embedding output;
last stage: L/pp x stored + working set + logits; one stage (pp = 1): first + logits.
In-flight layers: 1F1B L/pp x min(n_mb, pp); interleaved min(L/(pp v) x (pp(v+1) - 1), n_mb L/pp)
(Korthikanti 2022; Megatron's warm-up depth), as in `optimizer.model.step`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from .choice import ChoiceVars
from .common import new_int, product
from .tables import Tables


@dataclass
class MemoryVars:
    state: cp_model.IntVar
    inflight: cp_model.IntVar
    enforce: cp_model.IntVar  # the literal guarding memory.hbm (for explanations)

    def extract(self, solver: cp_model.CpSolver) -> dict[str, int]:
        return {"state_kib": int(solver.Value(self.state)), "inflight_layers": int(solver.Value(self.inflight))}


def build(T: Tables, m: cp_model.CpModel, c: ChoiceVars) -> MemoryVars:
    Lt, LV, LM, BE = T.L, T.LV, T.LM, T.BETA
    enforce = m.NewBoolVar("memory.hbm")
    big = 2**62 // 4  # KiB
    state = m.NewIntVar(0, big, "state_memory")
    for j, z in enumerate(T.z_vals):
        m.Add(state >= c.by_l.get(f"wgo{z}", Lt[f"wgo{z}"])).OnlyEnforceIf(c.z_lits[j])
    stored, working = c.by_beta.get("stored", BE["stored"]), c.by_beta.get("working", BE["working"])
    embout, logits = c.by_beta.get("embout", BE["embout"]), c.by_beta.get("logits", BE["logits"])
    reserved = c.by_l.get("reserved", Lt["reserved"])
    NL = c.by_lm.get("NL", LM["NL"])
    infl = new_int(m, 0, int(LM["NL"].max()), "inflight_layers")
    i1 = c.by_lm.get("infl1", LM["infl1"])
    if c.v1 is not None:
        m.Add(infl >= i1).OnlyEnforceIf(c.v1)
    if any(v > 1 for v in T.v_vals):
        iv = c.by_lv.get("inflv", LV["inflv"])
        ivm = new_int(m, 0, int(LM["NL"].max()), "inflight_interleaved_capped")
        m.AddMinEquality(ivm, [iv, NL])
        if c.v1 is not None:
            m.Add(infl >= ivm).OnlyEnforceIf(c.v1.Not())
        else:
            m.Add(infl >= ivm)
    first = product(m, infl, stored, "act_first_stored")
    last = product(m, c.by_l.get("Ls", Lt["Ls"]), stored, "act_last_stored")
    cap = T.cap_kib
    m.Add(state + first + working + embout + logits + reserved <= cap).OnlyEnforceIf([enforce, c.ppgt1.Not()])
    m.Add(state + first + working + embout + reserved <= cap).OnlyEnforceIf([enforce, c.ppgt1])
    m.Add(state + last + working + logits + reserved <= cap).OnlyEnforceIf([enforce, c.ppgt1])
    return MemoryVars(state, infl, enforce)
