"""The integer rules as named constraint groups guarded by literals, for explanations (`paraplan check`).

The rules themselves live in `optimizer.rules.layout` (`rule_masks`, one vectorised predicate per group); this
module only tabulates them over each knob's candidate values and posts each group as a table constraint
enforced by its own literal. The solver is asked to satisfy all groups under assumptions, and on
infeasibility its sufficient assumptions are shrunk (deletion filter) to a minimal conflicting set:

    rules.gpus, rules.tp_split, rules.layers, rules.experts, rules.batch, rules.interleave,
    rules.context, network.must_fill     the groups of `optimizer.rules.layout.Group`
    caps.cp                              the search's default cap on cp (`optimizer.rules.layout.Caps`)
    fixed.<knob>                         a knob fixed or restricted by the problem (execution or search)

Each knob ranges over the union of the values any single group allows (divisors of the GPU count, of the
heads, layers, batch, sequence, experts) and the fixed values, so that no group is hidden in a domain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from formulations.cp_sat import cp_model
from optimizer.rules.layout import CAPS, Group, divisors, rule_masks, uneven_vpps
from optimizer.schema import Problem
from optimizer.schema.stack import Stack

TEXT = {
    Group.GPUS: "tp*pp*dp*cp must {eq} the {n} GPUs",
    Group.TP_SPLIT: "tp must divide the {heads} heads and the ffn ({ffn}), and split the {kv} K/V heads",
    Group.LAYERS: "pp*vpp must divide the {layers} layers (or layers + 2 with pp_embedding_loss; with "
    "pp_uneven, vpp must divide the busiest stage's ceil(slots / pp))",
    Group.EXPERTS: "{experts}",
    Group.BATCH: "dp*micro_batch must divide the global batch {batch}",
    Group.INTERLEAVE: "an interleaved schedule (vpp > 1), or MaxText's pipeline, needs the micro-batch count "
    "to be a multiple of pp",
    Group.CONTEXT: "2*cp must divide the sequence length {seq}",
    Group.MUST_FILL: "parallel groups must tile the network tiers marked must_fill",
    Group.CAP_CP: "cp is capped at {cap} by default (name cp in `search` to lift the cap)",
}
KNOBS = ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "ep", "etp", "pp_embedding_loss", "pp_uneven")


def describe(problem: Problem, group: str, fixed: dict[str, list]) -> str:
    llm = problem.llm
    if group.startswith("fixed."):
        k = group.split(".", 1)[1]
        return f"{k} is fixed to {fixed[k][0] if len(fixed[k]) == 1 else fixed[k]}"
    eq = "be at most" if problem.options.allow_idle_gpus else "equal"
    if problem.options.gpu_multiple > 1:
        eq = f"be a multiple of {problem.options.gpu_multiple} and {eq}"
    mo = llm.moe
    experts = (
        f"ep must divide the {mo.experts} experts, etp must divide tp and the expert ffn ({mo.expert_ffn}), "
        "and ep*etp the tp*cp*dp ranks of a pipeline stage"
        if mo
        else "a dense model has no expert parallelism (ep = 1, etp = tp)"
    )
    return TEXT[Group(group)].format(
        eq=eq,
        n=problem.num_gpus,
        experts=experts,
        heads=llm.heads,
        ffn=llm.ffn,
        kv=llm.kv,
        layers=llm.layers,
        batch=problem.training.global_batch,
        seq=problem.seq_len,
        cap=CAPS.cp_limit(problem),
    )


def domains(problem: Problem, fixed: dict[str, list]) -> dict[str, list[int]]:
    """Candidate values of each knob: what any one group allows, plus the fixed values."""
    llm, n, B, S, L = (
        problem.llm,
        problem.num_gpus,
        problem.training.global_batch,
        problem.seq_len,
        problem.llm.layers,
    )

    def upto(*sets):
        return {v for s in sets for v in s if v <= n}

    dn = divisors(n)
    dom = {
        "tp": upto(dn, divisors(llm.heads)),
        "pp": upto(dn, divisors(L), divisors(L + 2)),
        "cp": upto(dn, divisors(max(S // 2, 1))),
        "dp": upto(dn, divisors(B)),
        "vpp": set(divisors(L)) | set(divisors(L + 2)),
        "micro_batch": set(divisors(B)),
        "ep": upto(dn, divisors(llm.moe.experts)) if llm.moe else {1},
        "etp": upto(dn, divisors(llm.heads), divisors(llm.moe.expert_ffn) if llm.moe else []),
        "pp_embedding_loss": {0, 1},
        "pp_uneven": {0},  # uneven splits only where the problem fixes or searches them (below)
    }
    for k, vals in fixed.items():
        if k in dom:
            dom[k] |= {int(v) for v in vals}
    if 1 in dom["pp_uneven"]:  # uneven splits: any pp of the GPUs, vpp dividing some stage's count
        dom["pp"] |= {q for q in dn if 1 < q <= L + 2 + problem.mtp_layers}
        dom["vpp"] |= uneven_vpps(problem.pipeline_blocks, dom["pp"])  # with and without el slots
    return {k: sorted(v) for k, v in dom.items()}


def _table(problem: Problem, dom: dict[str, list[int]], names: tuple[str, ...], group: Group, **const):
    """Rows of `names`' values (cartesian product of their domains) that `group` accepts."""
    grids = np.meshgrid(*(np.array(dom[k], dtype=np.int64) for k in names), indexing="ij")
    cols = {k: g.reshape(-1) for k, g in zip(names, grids, strict=True)}
    arg = {"tp": 1, "pp": 1, "dp": 1, "cp": 1} | const | cols
    ok = rule_masks(
        problem,
        arg["tp"],
        arg["pp"],
        arg["dp"],
        arg["cp"],
        arg.get("vpp", 1),
        arg.get("micro_batch", 1),
        arg.get("ep", 1),
        arg.get("etp"),
        arg.get("pp_embedding_loss", 0),
        arg.get("pp_uneven", 0),
        searched=True,
    )[group]
    ok = np.broadcast_to(ok, cols[names[0]].shape)
    return [tuple(int(cols[k][i]) for k in names) for i in np.nonzero(ok)[0]]


# products past it break rules.gpus anyway (num_gpus <= 2^24); keeps CP-SAT's domains in int64
PRODUCT_CAP = 2**40


@dataclass
class RuleModel:
    """The explanation model under construction: the knobs' variables `v` over their domains `dom`, and
    the literal of each group posted so far (`lit`, by group name)."""

    problem: Problem
    dom: dict[str, list[int]]
    m: cp_model.CpModel
    v: dict[str, cp_model.IntVar]
    lit: dict[str, cp_model.IntVar] = field(default_factory=dict)

    @property
    def hi(self) -> dict[str, int]:
        """The largest candidate of each degree (tp, pp, cp, dp)."""
        return {k: max(self.dom[k]) for k in ("tp", "pp", "cp", "dp")}

    def group(self, name: str):
        """A new literal for group `name`, which enforces its constraints."""
        self.lit[str(name)] = self.m.NewBoolVar(str(name))
        return self.lit[str(name)]

    def allowed(self, names, g, **const) -> None:
        """Group `g` as a table over `names` (the rows `_table` accepts), enforced by its literal."""
        rows = _table(self.problem, self.dom, names, g, **const)
        self.m.AddAllowedAssignments([self.v[k] for k in names], rows).OnlyEnforceIf(self.group(g))


def up(x: int) -> int:
    """A product's upper bound, capped at PRODUCT_CAP."""
    return min(x, PRODUCT_CAP)


def define_knobs(problem: Problem, fixed: dict[str, list]) -> RuleModel:
    """A model with one variable per knob (`KNOBS`, in order) over its candidate values (`domains`)."""
    dom = domains(problem, fixed)
    m = cp_model.CpModel()
    v = {k: m.NewIntVarFromDomain(cp_model.Domain.FromValues(dom[k]), k) for k in KNOBS}
    return RuleModel(problem, dom, m, v)


def define_gpus(r: RuleModel) -> None:
    """rules.gpus: the product of the degrees (vectorised check of the full 4-axis grid would be large)
    equals the GPU count (at most it with idle GPUs allowed; a multiple of `gpu_multiple`)."""
    problem, m, v, hi = r.problem, r.m, r.v, r.hi
    n = problem.num_gpus
    a = m.NewIntVar(1, up(hi["tp"] * hi["pp"]), "tp*pp")
    b = m.NewIntVar(1, up(hi["tp"] * hi["pp"] * hi["cp"]), "tp*pp*cp")
    tot = m.NewIntVar(1, up(hi["tp"] * hi["pp"] * hi["cp"] * hi["dp"]), "tp*pp*cp*dp")
    m.AddMultiplicationEquality(a, [v["tp"], v["pp"]])
    m.AddMultiplicationEquality(b, [a, v["cp"]])
    m.AddMultiplicationEquality(tot, [b, v["dp"]])
    g = r.group(Group.GPUS)
    (m.Add(tot <= n) if problem.options.allow_idle_gpus else m.Add(tot == n)).OnlyEnforceIf(g)
    k = problem.options.gpu_multiple
    if k > 1:
        m.Add(
            tot == k * m.NewIntVar(0, up(hi["tp"] * hi["pp"] * hi["cp"] * hi["dp"]) // k + 1, "nodes")
        ).OnlyEnforceIf(g)


def define_tp_split(r: RuleModel) -> None:
    """rules.tp_split: tp among the values the group accepts on its own."""
    r.m.AddLinearExpressionInDomain(
        r.v["tp"],
        cp_model.Domain.FromValues([x[0] for x in _table(r.problem, r.dom, ("tp",), Group.TP_SPLIT)] or [0]),
    ).OnlyEnforceIf(r.group(Group.TP_SPLIT))


def define_experts(r: RuleModel) -> None:
    """rules.experts: a dense model has ep = 1 and etp = tp; a MoE model has etp dividing tp and the expert
    ffn, ep dividing the experts, and ep*etp dividing the tp*cp*dp ranks of a stage."""
    llm, m, v, dom, hi = r.problem.llm, r.m, r.v, r.dom, r.hi
    if llm.moe is None:
        g = r.group(Group.EXPERTS)
        m.Add(v["ep"] == 1).OnlyEnforceIf(g)
        m.Add(v["etp"] == v["tp"]).OnlyEnforceIf(g)
        return
    g = r.group(Group.EXPERTS)
    m.AddAllowedAssignments(
        [v["tp"], v["etp"]],
        [(t, e) for t in dom["tp"] for e in dom["etp"] if t % e == 0 and llm.moe.expert_ffn % e == 0],
    ).OnlyEnforceIf(g)
    m.AddLinearExpressionInDomain(
        v["ep"], cp_model.Domain.FromValues([e for e in dom["ep"] if llm.moe.experts % e == 0] or [0])
    ).OnlyEnforceIf(g)
    tc = m.NewIntVar(1, up(hi["tp"] * hi["cp"]), "tp*cp")
    tcd = m.NewIntVar(1, up(hi["tp"] * hi["cp"] * hi["dp"]), "tp*cp*dp")
    m.AddMultiplicationEquality(tc, [v["tp"], v["cp"]])
    m.AddMultiplicationEquality(tcd, [tc, v["dp"]])
    ee = m.NewIntVar(1, up(max(dom["ep"]) * max(dom["etp"])), "ep*etp")
    q = m.NewIntVar(1, up(hi["tp"] * hi["cp"] * hi["dp"]), "edp")
    m.AddMultiplicationEquality(ee, [v["ep"], v["etp"]])
    m.AddMultiplicationEquality(tcd, [ee, q]).OnlyEnforceIf(g)


def define_interleave(r: RuleModel) -> None:
    """rules.interleave: only binds when vpp > 1 (a table over (dp, micro_batch, pp) under that literal); on
    the maxtext stack always (its pipeline needs whole rounds of micro-batches; pp 1 always passes)."""
    m, v = r.m, r.v
    g = r.group(Group.INTERLEAVE)
    rows = _table(r.problem, r.dom, ("dp", "micro_batch", "pp"), Group.INTERLEAVE, vpp=2)
    if r.problem.stack == Stack.MAXTEXT:
        m.AddAllowedAssignments([v["dp"], v["micro_batch"], v["pp"]], rows).OnlyEnforceIf(g)
        return
    v1 = m.NewBoolVar("vpp==1")
    m.Add(v["vpp"] == 1).OnlyEnforceIf(v1)
    m.Add(v["vpp"] > 1).OnlyEnforceIf(v1.Not())
    m.AddAllowedAssignments([v["dp"], v["micro_batch"], v["pp"]], rows).OnlyEnforceIf([g, v1.Not()])


def define_cp_cap(r: RuleModel) -> None:
    """caps.cp: the search's default cap on cp, unless the search names cp or no candidate exceeds it."""
    cap = CAPS.cp_limit(r.problem)
    if r.problem.search_rules().get("cp") is None and max(r.dom["cp"]) > cap:
        r.m.Add(r.v["cp"] <= cap).OnlyEnforceIf(r.group(Group.CAP_CP))


def define_fixed(r: RuleModel, fixed: dict[str, list]) -> None:
    """fixed.<knob>: each knob the problem fixes or restricts within its values."""
    for k, vals in fixed.items():
        if k in r.v:
            g = r.group(f"fixed.{k}")
            r.m.AddLinearExpressionInDomain(
                r.v[k], cp_model.Domain.FromValues([int(x) for x in vals])
            ).OnlyEnforceIf(g)


def build(problem: Problem, fixed: dict[str, list], skip: frozenset[str] = frozenset()):
    """(model, {group: literal}, {knob: var}) for the rules and the fixed knobs; the groups in `skip` are
    switched off."""
    r = define_knobs(problem, fixed)
    define_gpus(r)
    define_tp_split(r)
    r.allowed(("pp", "vpp", "pp_embedding_loss", "pp_uneven"), Group.LAYERS)
    define_experts(r)
    r.allowed(("dp", "micro_batch"), Group.BATCH)
    define_interleave(r)
    r.allowed(("cp",), Group.CONTEXT)
    define_cp_cap(r)
    if any(net.must_fill for net in problem.system.networks):
        r.allowed(("tp", "cp", "pp", "dp"), Group.MUST_FILL)
    define_fixed(r, fixed)
    for name in skip:
        if name in r.lit:
            r.m.Add(r.lit[name] == 0)
    return r.m, r.lit, r.v


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


def values(
    problem: Problem, fixed: dict[str, list], knob: str, without: set[str], candidates: list[int]
) -> list[int]:
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
