"""CP-SAT model of a heterogeneous pipeline (`optimizer.model.pipeline_mix`) for one data-parallel degree d
and micro-batch b (the driver `optimizer.drivers.pipeline_mix` runs it over every legal (d, b)).

Decision: per pipeline position g (G positions, in order), one row of that position's candidate table, a
(node type, tp, recompute, stages s_g, layers per stage L_g) whose terms the analytical model filled
(`group_terms`, ns and KiB integers). Constraints:

    type_g all different                                    a type holds at most one group
    sum_g s_g*L_g = L                                       every layer on exactly one stage
    sum_g cost_g <= budget, sum_g power_g <= power cap      (capex; nodes of a type within its limit by the
                                                            table)
    sum_{g'>g} s_g' <= rmax_g                               memory of each non-last group's first stage:
        rmax = the most stages after it with a*min(n_mb, s_g + rmax) <= slack (exact in its table, as is
        the last group's memory)

Objective (`y >= f(x)` for the maxima, exact at the optimum when minimising):

    T = (n_mb-1)*M + sum_g s_g*u_g + he + 2*n_mb*Pmax + 2*(sum_g (s_g-1)*p2p_g + sum_b J_b) + X
    M >= u_g, M >= u_last + he;  Pmax >= p2p_g (s_g > 1), Pmax >= J_b;  X >= x_g
    J_b >= each side's message over each side's network (the join's time: the larger message over the
           slower net)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formulations.common import new_int
from formulations.cp_sat import cp_model

NS = 1e9  # time unit: ns
KIB = 1024.0


@dataclass
class Position:
    """The candidate table of one pipeline position: integer columns of equal length."""

    cols: dict[
        str, np.ndarray
    ]  # type, tp, rec, stages, layers, u, he, p2p_in, join, su, fill, x, a, slack, cost, power

    @property
    def n(self) -> int:
        return len(self.cols["type"])


@dataclass
class PieceVars:
    rows: list  # per position: its one-hot row literals
    objective: cp_model.IntVar

    def extract(self, solver: cp_model.CpSolver) -> list[int]:
        return [next(r for r, x in enumerate(xs) if solver.BooleanValue(x)) for xs in self.rows]


@dataclass
class _Rows:
    """Each position's one-hot row literals `xs` over its candidate table `pos`; every column of the chosen
    rows is a linear sum of the literals."""

    pos: list[Position]
    xs: list[list]

    def col(self, g: int, k: str):
        """Column `k` of position g's chosen row (a linear expression of its literals)."""
        v = self.pos[g].cols[k]
        n = self.pos[g].n
        return cp_model.LinearExpr.WeightedSum(
            [self.xs[g][r] for r in range(n) if v[r]], [int(v[r]) for r in range(n) if v[r]]
        )

    def used(self, g: int, t: int):
        """1 when position g's row is of type t (a linear expression of its literals)."""
        return sum(self.xs[g][r] for r in np.flatnonzero(self.pos[g].cols["type"] == t))


def define_rows(m: cp_model.CpModel, pos: list[Position]) -> _Rows:
    """One row per position: a one-hot literal per candidate row, exactly one of them true."""
    xs = []
    for g, p in enumerate(pos):
        x = [m.NewBoolVar(f"pos{g}.row{r}") for r in range(p.n)]
        m.AddExactlyOne(x)
        xs.append(x)
    return _Rows(pos, xs)


def define_placement(
    m: cp_model.CpModel, rows: _Rows, layers: int, budget: int | None, power: int | None
) -> list[int]:
    """Types all different, every layer on one stage, capex and power within their caps, and the memory of
    each non-last group's first stage; the node types of the tables."""
    pos, xs, col = rows.pos, rows.xs, rows.col
    G = len(pos)
    types = sorted({int(t) for p in pos for t in p.cols["type"]})
    for t in types:  # a type holds at most one group
        m.Add(sum(xs[g][r] for g in range(G) for r in np.flatnonzero(pos[g].cols["type"] == t)) <= 1)
    m.Add(sum(col(g, "sl") for g in range(G)) == layers)
    if budget is not None:
        m.Add(sum(col(g, "cost") for g in range(G)) <= budget)
    if power is not None:
        m.Add(sum(col(g, "power") for g in range(G)) <= power)
    # memory of each non-last group's first stage: a*min(n_mb, s_g + stages after it) <= slack, as a bound on
    # the stages after it that the chosen row allows (`rmax`, from its own table)
    for g in range(G - 1):
        m.Add(sum(col(h, "stages") for h in range(g + 1, G)) <= col(g, "rmax"))
    return types


def define_slowest_stage(m: cp_model.CpModel, rows: _Rows) -> tuple[cp_model.IntVar, int]:
    """M >= u_g, M >= u_last + he (ns): the slowest stage, and its upper bound."""
    pos, col = rows.pos, rows.col
    G = len(pos)
    big = int(max(int(p.cols["u"].max()) + int(p.cols["he"].max()) for p in pos))
    M = new_int(m, 0, big, "slowest_stage_ns")
    for g in range(G):
        m.Add(M >= col(g, "u"))
    m.Add(M >= col(G - 1, "u") + col(G - 1, "he"))
    return M, big


def define_exchanges(m: cp_model.CpModel, rows: _Rows, types: list[int]) -> tuple[cp_model.IntVar, list, int]:
    """The joins J_b between neighbouring groups and Pmax >= p2p_g, J_b (ns): (Pmax, joins, their upper
    bound)."""
    pos, col, used = rows.pos, rows.col, rows.used
    G = len(pos)
    jcols = sorted(k for k in pos[0].cols if k.startswith("join") and k != "join_own")
    pbig = int(max(max([int(p.cols["p2p_in"].max())] + [int(p.cols[k].max()) for k in jcols]) for p in pos))
    Pmax = new_int(m, 0, pbig, "p2p_max_ns")
    joins = []
    for g in range(G - 1):
        J = new_int(m, 0, pbig, f"join{g}_ns")
        # the larger message over the slower of the two sides' networks: each side's message over its own
        # network, and over the other side's network when that side is of type t
        m.Add(J >= col(g, "join_own"))
        m.Add(J >= col(g + 1, "join_own"))
        for t in types:
            m.Add(J >= col(g, f"join{t}") - pbig * (1 - used(g + 1, t)))
            m.Add(J >= col(g + 1, f"join{t}") - pbig * (1 - used(g, t)))
        m.Add(Pmax >= J)
        joins.append(J)
    for g in range(G):
        m.Add(Pmax >= col(g, "p2p_in"))
    return Pmax, joins, pbig


def define_optimizer(m: cp_model.CpModel, rows: _Rows) -> tuple[cp_model.IntVar, int]:
    """X >= x_g (ns): the slowest group's data-parallel optimizer step, and its upper bound."""
    pos, col = rows.pos, rows.col
    xbig = int(max(int(p.cols["x"].max()) for p in pos))
    X = new_int(m, 0, xbig, "dp_optimizer_ns")
    for g in range(len(pos)):
        m.Add(X >= col(g, "x"))
    return X, xbig


def define_step_time(
    m: cp_model.CpModel, rows: _Rows, n_mb: int, M, big: int, Pmax, joins: list, pbig: int, X, xbig: int
) -> cp_model.IntVar:
    """T of the module docstring (ns) as a variable bounded by the sum of its terms' upper bounds."""
    pos, col = rows.pos, rows.col
    G = len(pos)
    T = (
        (n_mb - 1) * M
        + sum(col(g, "su") for g in range(G))
        + col(G - 1, "he")
        + 2 * n_mb * Pmax
        + 2 * (sum(col(g, "fill") for g in range(G)) + sum(joins))
        + X
    )
    hi = (
        (n_mb - 1) * big
        + sum(int(p.cols["su"].max()) for p in pos)
        + big
        + 2 * n_mb * pbig
        + 2 * (sum(int(p.cols["fill"].max()) for p in pos) + G * pbig)
        + xbig
    )
    obj = new_int(m, 0, hi, "step_time_ns")
    m.Add(obj == T)
    return obj


def build(
    m: cp_model.CpModel,
    pos: list[Position],
    layers: int,
    n_mb: int,
    budget: int | None,
    power: int | None,
    upper: int | None = None,
) -> PieceVars:
    """The model of one (d, b) (module docstring); `upper`: an incumbent's step time (ns), a cut. Rows are
    one-hot literals per position, so every column is a linear sum and the LP relaxation bounds the step."""
    rows = define_rows(m, pos)
    types = define_placement(m, rows, layers, budget, power)
    M, big = define_slowest_stage(m, rows)
    Pmax, joins, pbig = define_exchanges(m, rows, types)
    X, xbig = define_optimizer(m, rows)
    obj = define_step_time(m, rows, n_mb, M, big, Pmax, joins, pbig, X, xbig)
    if upper is not None:
        m.Add(obj <= upper)
    m.Minimize(obj)
    return PieceVars(rows.xs, obj)
