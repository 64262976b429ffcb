"""Helpers shared by the formulation modules: shared table lookups, bounded products, index literals.

Variable bounds are kept in a registry (`bounds`) rather than read back from the model proto."""

from __future__ import annotations

from weakref import WeakKeyDictionary

import numpy as np

from formulations.cp_sat import cp_model

# per model (dropped with it): variable index -> (lo, hi)
_BOUNDS: WeakKeyDictionary[cp_model.CpModel, dict[int, tuple[int, int]]] = WeakKeyDictionary()


def _register(m: cp_model.CpModel, v: cp_model.IntVar, lo: int, hi: int) -> None:
    _BOUNDS.setdefault(m, {})[v.Index()] = (int(lo), int(hi))


def new_int(m: cp_model.CpModel, lo: int, hi: int, name: str) -> cp_model.IntVar:
    v = m.NewIntVar(int(lo), int(hi), name)
    _register(m, v, lo, hi)
    return v


def bounds(m: cp_model.CpModel, v: cp_model.IntVar) -> tuple[int, int]:
    return _BOUNDS[m][v.Index()]


class Lookups:
    """Tables sharing one index, read through a single table constraint [index, col1, col2, ...]:
        one encoding of the index for all columns instead of one element constraint per column. Only the rows
    in use (`rows`: those the kept pairs read) enter the table and the columns' domains."""

    def __init__(self, m: cp_model.CpModel, index, n: int, name: str, rows: np.ndarray | None = None):
        self.m, self.index, self.n, self.name = m, index, n, name
        self.rows = np.arange(n) if rows is None else np.unique(np.asarray(rows, dtype=np.int64))
        self.cols: dict[str, np.ndarray] = {}
        self.vars: dict[str, cp_model.IntVar] = {}

    def get(self, col: str, table: np.ndarray) -> cp_model.IntVar:
        if col not in self.vars:
            vals = np.asarray(table, dtype=np.int64).reshape(-1)
            assert len(vals) == self.n, (col, len(vals), self.n)
            used = np.unique(vals[self.rows])
            var = self.m.NewIntVarFromDomain(cp_model.Domain.FromValues(used.tolist()), f"{self.name}.{col}")
            _register(self.m, var, used[0], used[-1])
            self.cols[col] = vals
            self.vars[col] = var
        return self.vars[col]

    def close(self) -> None:
        """Post the table over the index values in use."""
        if not self.cols:
            return
        idx = self.rows
        data = np.stack([idx] + [self.cols[c][idx] for c in self.cols], axis=1)
        self.m.AddAllowedAssignments([self.index] + [self.vars[c] for c in self.cols], data.tolist())


def product(m: cp_model.CpModel, a: cp_model.IntVar, b: cp_model.IntVar, name: str) -> cp_model.IntVar:
    """A variable equal to a * b, with bounds from the factors' bounds."""
    lo_a, hi_a = bounds(m, a)
    lo_b, hi_b = bounds(m, b)
    cands = [lo_a * lo_b, lo_a * hi_b, hi_a * lo_b, hi_a * hi_b]
    if max(abs(x) for x in cands) >= 2**62:
        raise OverflowError(f"product {name} may exceed int64: bounds {cands}")
    var = new_int(m, min(cands), max(cands), name)
    m.AddMultiplicationEquality(var, [a, b])
    return var


def index_literals(m: cp_model.CpModel, var: cp_model.IntVar, n: int, name: str) -> list:
    """Booleans b[i] <=> (var == i) for i in 0..n-1."""
    lits = []
    for i in range(n):
        b = m.NewBoolVar(f"{name}=={i}")
        m.Add(var == i).OnlyEnforceIf(b)
        m.Add(var != i).OnlyEnforceIf(b.Not())
        lits.append(b)
    m.AddExactlyOne(lits)
    return lits
