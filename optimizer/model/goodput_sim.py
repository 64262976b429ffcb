"""A discrete-event simulation of a training run with failures, restarts, checkpoints and spares: the check of
`optimizer.model.goodput`'s closed form (times in s).

Each replica trains in segments of tau seconds, each followed by a checkpoint stall; unplanned interruptions
arrive as a Poisson process at the job's rate, planned ones at theirs. An unplanned interruption loses the
segment in progress, and with asynchronous save also the segment before it when its checkpoint was still being
written (within write_s of the segment's start); it costs detect + restart + reload, and when it takes a node
out of service (with the cause mix's share) the job takes a spare or waits for the first repaired node. A
planned interruption checkpoints first (a stall), then restarts and reloads. Replicas run side by side
(numpy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimizer.model.goodput import Checkpoint, Inputs, Rates


@dataclass
class Simulated:
    """Wall times of the replicas, s, and their failure counts."""

    wall_s: np.ndarray
    interruptions: np.ndarray

    def quantile(self, q: float) -> float:
        return float(np.quantile(self.wall_s, q))


def _spare(pool: np.ndarray, now: np.ndarray, repair_s: float) -> np.ndarray:
    """For replicas whose node failed at `now`: the wait for a replacement, updating the pool of spares' ready
    times in place (the failed node joins it, ready after its repair; the job takes the earliest ready)."""
    back = now + repair_s
    cand = np.concatenate([pool, back[:, None]], axis=1)
    j = np.argmin(cand, axis=1)
    ready = cand[np.arange(len(j)), j]
    swap = j < pool.shape[1]
    rows = np.nonzero(swap)[0]
    pool[rows, j[swap]] = back[swap]
    return np.maximum(ready - now, 0.0)


def _restart(rng, lam: float, base: float, count: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Time to restart each of `rows`, s: `base`, begun again whenever another failure interrupts it (as
    Daly's model has it), each counted."""
    out = np.zeros(len(rows))
    todo = np.arange(len(rows))
    while len(todo) and lam > 0:
        f = rng.exponential(1 / lam, len(todo))
        again = f < base
        out[todo[~again]] += base
        out[todo[again]] += f[again]
        count[rows[todo[again]]] += 1
        todo = todo[again]
    if lam <= 0:
        out += base
    return out


def simulate(
    inp: Inputs,
    rates: Rates,
    ck: Checkpoint,
    train_s: float,
    tau_s: float,
    spares: int | None,
    replicas: int = 400,
    seed: int = 0,
) -> Simulated:
    """Simulate `replicas` runs of train_s seconds of training with checkpoints every tau_s (one job: rates
    and checkpoint of one n, scalars)."""
    rng = np.random.default_rng(seed)
    rel = inp.reliability
    lam, lam_p = float(rates.lam[0]), float(rates.lam_planned[0])
    base = rel.detect_s + rel.restart_s + ck.reload_s
    share = rel.node_share()
    done = np.zeros(replicas)
    wall = np.zeros(replicas)
    prev = np.zeros(replicas)  # the last segment, for a checkpoint still being written
    count = np.zeros(replicas)
    pool = None if spares is None else np.zeros((replicas, int(spares)))
    rows = np.arange(replicas)
    while True:
        live = rows[done < train_s - 1e-9]
        if len(live) == 0:
            break
        seg = np.minimum(tau_s, train_s - done[live])
        need = seg + ck.stall_s
        f = rng.exponential(1 / lam, len(live)) if lam > 0 else np.full(len(live), np.inf)
        p = rng.exponential(1 / lam_p, len(live)) if lam_p > 0 else np.full(len(live), np.inf)
        fail = (f < need) & (f <= p)
        plan = (p < need) & ~fail
        ok = ~fail & ~plan
        i = live[ok]
        wall[i] += need[ok]
        done[i] += seg[ok]
        prev[i] = seg[ok]
        i = live[plan]  # checkpoint the partial segment, restart, reload
        wall[i] += p[plan] + rates.planned_s[0]
        done[i] += np.minimum(p[plan], seg[plan])
        prev[i] = 0.0
        i = live[fail]
        t = wall[i] + f[fail]
        inflight = inp.async_checkpoint & (f[fail] < ck.write_s)
        done[i] -= np.where(inflight, prev[i], 0.0)
        prev[i] = 0.0
        wait = np.zeros(len(i))
        node = rng.random(len(i)) < share
        if pool is not None and node.any():
            sub = pool[i[node]]
            wait[node] = _spare(sub, t[node], rel.repair_h * 3600.0)
            pool[i[node]] = sub
        wall[i] = t + wait + _restart(rng, lam, base, count, i)
        count[i] += 1
    return Simulated(wall, count)
