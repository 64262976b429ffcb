"""The integer rules as named constraint groups guarded by literals, for explanations (`paraplan check`).

Variables tp, pp, dp, cp, vpp, micro_batch over wide ranges; each group below is enforced by its own
literal, the solver is asked to satisfy all of them under assumptions, and on infeasibility its sufficient
assumptions are shrunk (deletion filter) to a minimal conflicting set of groups:

    rules.gpus        tp*pp*dp*cp = num_gpus (<= with allow_idle_gpus)
    rules.tp_split    tp divides heads and ffn; kv_heads divisible by tp or tp by kv_heads
    rules.layers      pp*vpp divides the layers, or layers + 2 with the embedding/loss split (and vpp = 1
                      without a pipeline)
    rules.experts     MoE: ep divides the experts, etp divides tp and expert_ffn, ep*etp divides tp*cp*dp;
                      dense: ep = 1, etp = tp
    rules.batch       dp*micro_batch divides the global batch
    rules.interleave  interleaving: micro-batches (B/(dp*micro_batch)) a multiple of pp
    rules.sequence    2*cp divides the sequence (load-balanced causal attention)
    rules.tiers       groups tile the network tiers marked must_fill
    fixed.<knob>      a knob fixed or restricted by the problem (execution or search)
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from optimizer.schema import Problem
from optimizer.space import divisors

TEXT = {
    "rules.gpus": "tp*pp*dp*cp must {eq} the {n} GPUs",
    "rules.tp_split": "tp must divide the {heads} heads and the ffn ({ffn}), and split the {kv} K/V heads",
    "rules.layers": "pp*vpp must divide the {layers} layers (or layers + 2 with pp_embedding_loss)",
    "rules.experts": "{experts}",
    "rules.batch": "dp*micro_batch must divide the global batch {batch}",
    "rules.interleave": "an interleaved schedule (vpp > 1) needs the micro-batch count to be a multiple of pp",
    "rules.sequence": "2*cp must divide the sequence length {seq}",
    "rules.tiers": "parallel groups must tile the network tiers marked must_fill",
}
KNOBS = ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "ep", "etp", "pp_embedding_loss")


def describe(problem: Problem, group: str, fixed: dict[str, list]) -> str:
    llm = problem.llm
    if group.startswith("fixed."):
        k = group.split(".", 1)[1]
        return f"{k} is fixed to {fixed[k][0] if len(fixed[k]) == 1 else fixed[k]}"
    eq = "be at most" if problem.options.allow_idle_gpus else "equal"
    if problem.options.gpu_multiple > 1:
        eq = f"be a multiple of {problem.options.gpu_multiple} and {eq}"
    mo = llm.moe
    experts = (f"ep must divide the {mo.experts} experts, etp must divide tp and the expert ffn ({mo.expert_ffn}), "
               "and ep*etp the tp*cp*dp ranks of a pipeline stage" if mo else
               "a dense model has no expert parallelism (ep = 1, etp = tp)")
    return TEXT[group].format(eq=eq, n=problem.num_gpus, experts=experts,
                              heads=llm.heads, ffn=llm.ffn, kv=llm.kv, layers=llm.layers,
                              batch=problem.training.global_batch, seq=problem.seq_len)


def build(problem: Problem, fixed: dict[str, list], skip: frozenset[str] = frozenset()):
    """(model, {group: literal}, {knob: var}) for the rules and the fixed knobs."""
    llm, n, B = problem.llm, problem.num_gpus, problem.training.global_batch
    L, S = llm.layers, problem.seq_len
    m = cp_model.CpModel()
    hi = {"tp": n, "pp": max(n, L), "dp": n, "cp": n, "vpp": L + 2, "micro_batch": B, "ep": n, "etp": n,
          "pp_embedding_loss": 1}
    for k, vals in fixed.items():
        if k in hi:
            hi[k] = max(hi[k], *[int(v) for v in vals])
    v = {k: m.NewIntVar(0 if k == "pp_embedding_loss" else 1, hi[k], k) for k in KNOBS}
    lit: dict[str, cp_model.IntVar] = {}

    def group(name: str):
        lit[name] = m.NewBoolVar(name)
        return lit[name]

    g = group("rules.gpus")
    a, b = m.NewIntVar(1, n * max(n, L), "tp*pp"), m.NewIntVar(1, n * n * max(n, L), "tp*pp*cp")
    tot = m.NewIntVar(1, n ** 3 * max(n, L), "tp*pp*cp*dp")
    m.AddMultiplicationEquality(a, [v["tp"], v["pp"]])
    m.AddMultiplicationEquality(b, [a, v["cp"]])
    m.AddMultiplicationEquality(tot, [b, v["dp"]])
    (m.Add(tot <= n) if problem.options.allow_idle_gpus else m.Add(tot == n)).OnlyEnforceIf(g)
    k = problem.options.gpu_multiple
    if k > 1:
        m.Add(tot == k * m.NewIntVar(1, n // k + 1, "nodes")).OnlyEnforceIf(g)
    g = group("rules.tp_split")
    ok_tp = [t for t in range(1, hi["tp"] + 1) if llm.heads % t == 0 and llm.ffn % t == 0
             and (llm.kv % t == 0 or t % llm.kv == 0)]
    m.AddLinearExpressionInDomain(v["tp"], cp_model.Domain.FromValues(ok_tp)).OnlyEnforceIf(g)
    g = group("rules.layers")
    m.AddAllowedAssignments([v["pp"], v["vpp"], v["pp_embedding_loss"]], [
        (p, q, e) for p in range(1, hi["pp"] + 1) for e in (0, 1) for q in divisors(L + 2 * e)
        if (L + 2 * e) % (p * q) == 0 and (q == 1 or p > 1) and (e == 0 or p > 1)]).OnlyEnforceIf(g)
    g = group("rules.experts")
    mo = llm.moe
    if mo is None:
        m.Add(v["ep"] == 1).OnlyEnforceIf(g)
        m.Add(v["etp"] == v["tp"]).OnlyEnforceIf(g)
    else:
        m.AddLinearExpressionInDomain(v["ep"], cp_model.Domain.FromValues(
            [e for e in range(1, hi["ep"] + 1) if mo.experts % e == 0])).OnlyEnforceIf(g)
        m.AddAllowedAssignments([v["tp"], v["etp"]], [(t, e) for t in range(1, hi["tp"] + 1) for e in divisors(t)
                                                      if mo.expert_ffn % e == 0]).OnlyEnforceIf(g)
        tcd = m.NewIntVar(1, n ** 3, "tp*cp*dp")
        tc = m.NewIntVar(1, n ** 2, "tp*cp")
        m.AddMultiplicationEquality(tc, [v["tp"], v["cp"]])
        m.AddMultiplicationEquality(tcd, [tc, v["dp"]])
        ee = m.NewIntVar(1, n * n, "ep*etp")
        q = m.NewIntVar(1, n ** 3, "edp")
        m.AddMultiplicationEquality(ee, [v["ep"], v["etp"]])
        m.AddMultiplicationEquality(tcd, [ee, q]).OnlyEnforceIf(g)
    g = group("rules.batch")
    pairs = [(d, b_) for d in range(1, hi["dp"] + 1) if B % d == 0 for b_ in divisors(B // d)]
    m.AddAllowedAssignments([v["dp"], v["micro_batch"]], pairs).OnlyEnforceIf(g)
    g = group("rules.interleave")
    v1 = m.NewBoolVar("vpp==1")
    m.Add(v["vpp"] == 1).OnlyEnforceIf(v1)
    m.Add(v["vpp"] > 1).OnlyEnforceIf(v1.Not())
    trip = [(d, b_, p) for d, b_ in pairs for p in divisors(L) if (B // (d * b_)) % p == 0]
    m.AddAllowedAssignments([v["dp"], v["micro_batch"], v["pp"]], trip).OnlyEnforceIf([g, v1.Not()])
    g = group("rules.sequence")
    m.AddLinearExpressionInDomain(v["cp"], cp_model.Domain.FromValues(
        [c for c in range(1, hi["cp"] + 1) if S % (2 * c) == 0 or c == 1])).OnlyEnforceIf(g)
    nets = problem.system.networks
    if any(net.must_fill for net in nets):
        from optimizer.space import _tiers_one

        g = group("rules.tiers")
        rows = []
        for tp in divisors(n):
            for cp in divisors(n):
                for pp in divisors(n):
                    for dp in divisors(n):
                        if tp * cp * pp * dp > n:
                            continue
                        tr = _tiers_one([x.size for x in nets], tp, cp, dp, pp)
                        good = True
                        for i, net in enumerate(nets):
                            if net.must_fill:
                                prod = 1
                                for ax, d in (("tp", tp), ("cp", cp), ("dp", dp), ("pp", pp)):
                                    prod *= d if tr[ax] <= i else 1
                                good &= net.size % prod == 0
                        if good:
                            rows.append((tp, cp, pp, dp))
        m.AddAllowedAssignments([v["tp"], v["cp"], v["pp"], v["dp"]], rows).OnlyEnforceIf(g)
    for k, vals in fixed.items():
        if k in v:
            g = group(f"fixed.{k}")
            m.AddLinearExpressionInDomain(v[k], cp_model.Domain.FromValues([int(x) for x in vals])).OnlyEnforceIf(g)
    for name in skip:
        if name in lit:
            m.Add(lit[name] == 0)
    return m, lit, v


def conflict(problem: Problem, fixed: dict[str, list]) -> list[str] | None:
    """A minimal set of groups that cannot hold together (None when all can): the solver's sufficient
    assumptions for infeasibility, shrunk by a deletion filter."""
    m, lit, _ = build(problem, fixed)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    m.AddAssumptions(list(lit.values()))
    if s.Solve(m) != cp_model.INFEASIBLE:
        return None
    core_idx = set(s.SufficientAssumptionsForInfeasibility())
    core = [name for name, x in lit.items() if x.Index() in core_idx] or list(lit)
    for name in list(core):
        trial = [c for c in core if c != name]
        m2, lit2, _ = build(problem, fixed)
        m2.AddAssumptions([lit2[c] for c in trial])
        if s.Solve(m2) == cp_model.INFEASIBLE:
            core = trial
    return core


def values(problem: Problem, fixed: dict[str, list], knob: str, without: set[str],
           candidates: list[int]) -> list[int]:
    """The candidate values `knob` can take under every group except `without` (a solve per value)."""
    out = []
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    for c in candidates:
        m, lit, v = build(problem, fixed)
        m.Add(v[knob] == c)
        for name, x in lit.items():
            m.Add(x == (0 if name in without else 1))
        if s.Solve(m) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            out.append(c)
    return out
