"""Expected wall time, energy and cost to train: failures, restarts, checkpoints and spares around the step
time (goodput). Times in s, bandwidths in GB/s (10^9 B/s), power in W, energy in kWh, money in USD.

Checkpoint (Megatron-Core distributed checkpoint, PyTorch DCP): C = P (b_w + 8 + 4 m) bytes for P parameters,
b_w the training dtype's bytes, Adam's fp32 moments and (m = 1 with mixed precision) the fp32 master weights.
Both frameworks spread the writes over the data-parallel replicas (fully parallel save), so each of the n GPUs
writes C/n; a node writes its share at the slower of its own link and its share of the store:
    write w = max(C g / (n B_node), C / B_store),  reload r likewise at the read bandwidths.
The step stalls per checkpoint for delta = (C/n) / B_host (asynchronous save: the copy to host memory) or w.

Unplanned interruptions arrive at lambda = rate x n GPU-hours (Poisson, MTBF M = 1/lambda); each costs
    R = detect + restart + r (+ w with asynchronous save: the checkpoint in flight is lost).
Expected wall time for T_s of training in segments tau (Daly 2006, "A higher order estimate of the optimum
checkpoint interval for restart dumps", eq. 7, exponential failures):
    T_w = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau.
A share s of the interruptions takes a node out of service: with S spare nodes, the K nodes in repair are
Poisson(lambda s t_repair) and such a failure waits W = P(K >= S) t_repair / (S + 1) (none without a spare
count: a shared pool), a wait in which nothing runs to fail: T_w (1 + lambda s W). Planned interruptions
(rate lambda_p, each restart + reload + delta, no lost work) divide by (1 - lambda_p R_p). tau is the offered
interval that minimises the total (Young 1974: sqrt(2 delta M) is the first-order optimum). The P10-P90 band
is the compound-Poisson spread of the losses (L = R + U(0, tau + delta), plus W with share s).
The closed form agrees with `optimizer.model.goodput_sim` within a point of effective training where spares
are a pool or ample; with very few spares (a repair queue) it is approximate (tests state by how much).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from optimizer.model.params import count
from optimizer.schema.goodput import Energy, FailureCause, Goodput, Reliability, Storage

Z90 = 1.2815515655446004  # standard normal quantile of 0.9
GB = 1e9


@functools.cache
def defaults() -> dict:
    """`optimizer/model/goodput.yaml`: the cited defaults."""
    return yaml.safe_load((Path(__file__).with_name("goodput.yaml")).read_text())


@functools.cache
def default_reliability() -> Reliability:
    """Llama 3's interruption rates by cause (its Table 5) and restart costs."""
    d = defaults()["reliability"]
    per = 1e6 / d["gpu_hours"]
    causes = [
        FailureCause(name=k, per_mgpu_h=c * per, needs_node=node, source=d["source"])
        for k, (c, node) in d["counts"].items()
    ]
    return Reliability(
        causes=causes,
        planned_per_mgpu_h=d["planned_count"] * per,
        detect_s=float(d["detect_s"]),
        restart_s=float(d["restart_s"]),
        repair_h=float(d["repair_h"]),
        source=d["source"],
    )


@dataclass(frozen=True)
class Inputs:
    """A problem's goodput inputs with every default filled in."""

    reliability: Reliability
    storage: Storage
    energy: Energy
    async_checkpoint: bool
    host_copy_gbps: float
    intervals_s: tuple[float, ...]
    intervals_given: bool
    spare_nodes: int | None
    rent_usd_per_gpu_hour: float | None
    amortization_years: float | None

    @staticmethod
    def of(g: Goodput | None, system_reliability: Reliability | None = None) -> Inputs:
        g = g or Goodput()
        d = defaults()
        given = g.intervals_s()
        return Inputs(
            reliability=g.reliability or system_reliability or default_reliability(),
            storage=g.storage or Storage(**d["storage"]),
            energy=g.energy or Energy(**d["energy"]),
            async_checkpoint=g.async_checkpoint,
            host_copy_gbps=g.host_copy_gbps or float(d["host_copy_gbps"]),
            intervals_s=tuple(float(x) for x in (given or d["intervals_s"])),
            intervals_given=given is not None,
            spare_nodes=g.spare_count(),
            rent_usd_per_gpu_hour=g.rent_usd_per_gpu_hour,
            amortization_years=g.amortization_years,
        )


def checkpoint_bytes(llm, precision: str, master_weights: bool) -> float:
    """Bytes of one checkpoint of the whole model (weights, Adam moments, master weights), B."""
    d = defaults()
    fp32 = str(precision) == "fp32"  # the weights are their own master copy
    per = (
        (4 if fp32 else 2)
        + d["adam_moments_bytes"]
        + (d["master_weights_bytes"] if master_weights and not fp32 else 0)
    )
    return float(count(llm).total) * per


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a plan on n GPUs: bytes per GPU, write and reload times, the step's stall, s."""

    bytes_total: float
    bytes_per_gpu: float
    write_s: float
    reload_s: float
    stall_s: float


def checkpoint_cost(inp: Inputs, c_bytes: float, n, gpus_per_node: int) -> Checkpoint:
    """`Checkpoint` of c_bytes written by n GPUs (scalar or array), g per node (fully parallel save)."""
    n = np.asarray(n, dtype=float)
    per_gpu = c_bytes / n
    node = per_gpu * np.minimum(gpus_per_node, n)
    st = inp.storage
    write = np.maximum(node / (st.write_gbps_per_node * GB), c_bytes / (st.aggregate_write_gbps * GB))
    read = np.maximum(node / (st.read_gbps_per_node * GB), c_bytes / (st.aggregate_read_gbps * GB))
    stall = per_gpu / (inp.host_copy_gbps * GB) if inp.async_checkpoint else write
    return Checkpoint(c_bytes, per_gpu, write, read, stall)


def spare_wait_s(rel: Reliability, lam_node_per_s, spares: int | None):
    """Expected wait of a node-taking failure for a replacement, s: the chance K >= S that the S spares are
    all in repair (K ~ Poisson(lambda_node t_repair)), times t_repair / (S + 1); 0 with a shared pool."""
    if spares is None:
        return np.zeros_like(np.asarray(lam_node_per_s, dtype=float))
    t_rep = rel.repair_h * 3600.0
    a = np.asarray(lam_node_per_s, dtype=float) * t_rep
    # P(K >= S) = 1 - sum_{k<S} e^-a a^k / k!; past a + 12 sqrt(a) + 40 spares it is below 1e-30
    term = np.exp(-a)
    below = np.zeros_like(a)
    for k in range(min(int(spares), int(np.max(a + 12 * np.sqrt(a) + 40, initial=0)))):
        below = below + term
        term = term * a / (k + 1)
    if spares > np.max(a + 12 * np.sqrt(a) + 40, initial=0):
        below = np.ones_like(a)
    return np.clip(1.0 - below, 0.0, 1.0) * t_rep / (spares + 1)


def _waits(rel: Reliability, lam_node, spares):
    """`spare_wait_s` per job (spares: None, one count or one per job), with the failures that arrive only
    while the job runs: the node failure rate scaled by the running share 1 / (1 + lambda_node wait), a few
    fixed-point passes."""
    lam_node = np.asarray(lam_node, dtype=float)
    if spares is None:
        return np.zeros_like(lam_node)
    s = np.broadcast_to(np.asarray(spares), lam_node.shape)
    wait = np.zeros_like(lam_node)
    for _ in range(8):
        run = lam_node / (1.0 + lam_node * wait)
        pairs = zip(run.ravel(), s.ravel(), strict=True)
        wait = np.array([float(spare_wait_s(rel, a, int(k))) for a, k in pairs]).reshape(lam_node.shape)
    return wait


@dataclass
class Rates:
    """Per-second interruption rates of a job on n GPUs and what one interruption costs besides lost work."""

    lam: np.ndarray  # unplanned, 1/s
    lam_planned: np.ndarray  # planned, 1/s
    restart_s: np.ndarray  # R: detect + restart + reload (+ the write in flight)
    planned_s: np.ndarray  # R_p: restart + reload + stall
    wait_s: np.ndarray  # expected wait for a spare per node-taking interruption
    node_share: float  # the share of unplanned interruptions that take a node


def rates(inp: Inputs, n, ck: Checkpoint, spares) -> Rates:
    rel = inp.reliability
    n = np.asarray(n, dtype=float)
    lam = rel.per_mgpu_h() * 1e-6 * n / 3600.0
    lam_p = rel.planned_per_mgpu_h * 1e-6 * n / 3600.0
    share = rel.node_share()
    wait = _waits(rel, lam * share, spares)
    lost_write = ck.write_s if inp.async_checkpoint else 0.0
    restart = rel.detect_s + rel.restart_s + ck.reload_s + lost_write
    planned = rel.restart_s + ck.reload_s + ck.stall_s
    z = np.zeros_like(n)
    return Rates(lam + z, lam_p + z, restart + z, planned + z, wait + z, share)


def wall_factor(r: Rates, stall_s, tau_s):
    """Expected wall time per second of training (Daly's complete model, then the waits for spares, during
    which nothing runs to fail, then planned interruptions); arrays broadcast (tau along a last axis)."""
    lam = r.lam[..., None]
    seg = tau_s + np.asarray(stall_s)[..., None]
    restart = r.restart_s[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        unplanned = np.where(
            lam > 0,
            np.exp(lam * restart) * np.expm1(lam * seg) / np.where(lam > 0, lam, 1.0) / tau_s,
            seg / tau_s,
        )
    unplanned = unplanned * (1.0 + (r.lam * r.node_share * r.wait_s)[..., None])
    keep = 1.0 - (r.lam_planned * r.planned_s)[..., None]
    return np.where(keep > 0, unplanned / np.where(keep > 0, keep, 1.0), np.inf)


@dataclass
class PlanGoodput:
    """The expected time and cost to train of one plan."""

    effective_fraction: float
    expected_time_to_train_s: float
    p10_time_to_train_s: float
    p90_time_to_train_s: float
    failure_free_time_s: float
    checkpoint_interval_s: float
    checkpoint: Checkpoint
    mtbf_s: float
    expected_interruptions: float
    expected_planned_interruptions: float
    spare_nodes: int | None
    parts_s: dict[str, float]
    energy_kwh: float | None = None  # filled by `_price`
    energy_usd: float | None = None
    compute_usd: float | None = None
    expected_cost_usd: float | None = None


class GoodputInputError(ValueError):
    """Goodput inputs that cannot describe the run (an interval longer than the run or shorter than a write):
    the drivers report it as bad input at the field (`field`)."""

    def __init__(self, field_path: str, message: str):
        super().__init__(message)
        self.field = field_path


def _interval_choice(inp: Inputs, factor: np.ndarray, write_s: float, run_s: float) -> int:
    """Index of the offered interval with the least expected time, among those at least one checkpoint write
    long (asynchronous save: the next checkpoint cannot start before the last is written), as `job_factor`
    chooses (the objective's); given intervals must not all be longer than the run."""
    taus = np.asarray(inp.intervals_s)
    ok = taus >= write_s if inp.async_checkpoint else np.ones(len(taus), dtype=bool)
    if inp.intervals_given:
        if taus.min() > run_s:
            raise GoodputInputError(
                "goodput.checkpoint_interval_s",
                f"{taus.min():g} s is longer than the run's {run_s:,.0f} s of training: it would never "
                "checkpoint",
            )
        if not ok.any():
            raise GoodputInputError(
                "goodput.checkpoint_interval_s",
                f"every interval is shorter than one asynchronous checkpoint write ({write_s:,.1f} s)",
            )
    elif not ok.any():
        ok = taus == taus.max()
    return int(np.argmin(np.where(ok, factor, np.inf)))


@dataclass(frozen=True)
class Job:
    """What the goodput of one plan depends on besides the `Inputs`."""

    checkpoint_bytes: float
    n_gpus: int
    gpus_per_node: int
    step_s: float
    steps: float
    spare_nodes: int | None  # spares in all (the problem's plus the plan's idle whole nodes), None: a pool
    node_rated_w: float | None  # a node's nameplate power; None: no energy
    node_training_w: float | None = (
        None  # a node's draw with its GPUs busy, when known (a catalog's power_kw)
    )
    busy_share: float = 1.0  # the share of the step the GPUs compute (not waiting on communication, bubbles)
    rent_usd_per_gpu_hour: float | None = None
    capex_usd: float | None = None


def job_factor(inp: Inputs, job_bytes: float, n, gpus_per_node: int, spares) -> np.ndarray:
    """Expected wall time per second of training at the best offered interval, per n (array): the factor the
    `expected_time` objective multiplies step times by."""
    n = np.atleast_1d(np.asarray(n, dtype=float))
    ck = checkpoint_cost(inp, job_bytes, n, gpus_per_node)
    r = rates(inp, n, ck, spares)
    taus = np.asarray(inp.intervals_s)
    f = wall_factor(r, ck.stall_s, taus)
    if inp.async_checkpoint:  # as `_interval_choice`: at least one write long, else the longest offered
        ok = taus[None, :] >= np.asarray(ck.write_s)[:, None]
        ok = np.where(ok.any(axis=1, keepdims=True), ok, (taus == taus.max())[None, :])
        f = np.where(ok, f, np.inf)
    return f.min(axis=1)


def expected(inp: Inputs, job: Job) -> PlanGoodput:
    """Expected time and cost to train of one plan (`Job`), its parts and P10-P90 band."""
    n, g = job.n_gpus, job.gpus_per_node
    ck = checkpoint_cost(inp, job.checkpoint_bytes, n, g)
    ck = Checkpoint(
        *(float(getattr(ck, k)) for k in ("bytes_total", "bytes_per_gpu", "write_s", "reload_s", "stall_s"))
    )
    r = rates(inp, np.array([float(n)]), ck, job.spare_nodes)
    ts = job.steps * job.step_s
    f = wall_factor(r, np.array([ck.stall_s]), np.asarray(inp.intervals_s))[0]
    i = _interval_choice(inp, f, ck.write_s, ts)
    tau, total = inp.intervals_s[i], float(f[i]) * ts
    if not math.isfinite(total):
        every = 1 / max(float(r.lam[0]) + float(r.lam_planned[0]), 1e-300)
        raise GoodputInputError(
            "goodput",
            f"the job never finishes: on {n:,} GPUs an interruption comes every {every:,.0f} s, while a "
            f"restart takes {float(r.restart_s[0]):,.0f} s (reload {ck.reload_s:,.0f} s, checkpoint write "
            f"{ck.write_s:,.0f} s): check the reliability and storage inputs",
        )
    lam, lam_p, rs, rp = (float(x[0]) for x in (r.lam, r.lam_planned, r.restart_s, r.planned_s))
    wait = float(r.wait_s[0]) * r.node_share
    t_unpl = total * (1 - lam_p * rp) / (1 + lam * wait)
    n_u, n_p = lam * t_unpl, lam_p * total
    seg = tau + ck.stall_s
    w1 = float(r.wait_s[0])  # a node-taking interruption (share s) adds the wait
    m2 = rs * rs + rs * seg + seg * seg / 3.0 + r.node_share * (w1 * w1 + 2 * w1 * (rs + seg / 2))
    sd = math.sqrt(max(n_u * m2, 0.0))
    parts = {
        "compute_s": ts,
        "checkpoint_stalls_s": ts / tau * ck.stall_s,
        "restarts_s": n_u * rs + n_p * rp,
        "spare_waits_s": n_u * wait,
    }
    parts["lost_work_s"] = max(total - sum(parts.values()), 0.0)
    out = PlanGoodput(
        effective_fraction=ts / total,
        expected_time_to_train_s=total,
        p10_time_to_train_s=max(ts, total - Z90 * sd),
        p90_time_to_train_s=total + Z90 * sd,
        failure_free_time_s=ts,
        checkpoint_interval_s=float(tau),
        checkpoint=ck,
        mtbf_s=1.0 / lam if lam > 0 else math.inf,
        expected_interruptions=n_u,
        expected_planned_interruptions=n_p,
        spare_nodes=job.spare_nodes,
        parts_s=parts,
    )
    _price(inp, job, out)
    return out


def _price(inp: Inputs, job: Job, out: PlanGoodput) -> None:
    """Energy (in training idle + (peak - idle) x busy share, while down idle, spares idle throughout, times
    PUE) and the expected cost: rental GPU-hours (the rate includes the power: energy_usd 0), or the
    capital or its share plus the energy."""
    p = defaults()["power"]
    nodes = math.ceil(job.n_gpus / job.gpus_per_node)
    spares = job.spare_nodes or 0
    if job.node_rated_w is not None or job.node_training_w is not None:
        peak = p["peak_of_rated"]
        rated = job.node_rated_w if job.node_rated_w is not None else job.node_training_w / peak
        peak_w = job.node_training_w if job.node_training_w is not None else rated * peak
        idle_w = rated * p["idle_of_rated"]
        train_w = idle_w + (peak_w - idle_w) * job.busy_share
        ts, total = out.failure_free_time_s, out.expected_time_to_train_s
        joules = nodes * (train_w * ts + idle_w * (total - ts)) + spares * idle_w * total
        out.energy_kwh = joules * inp.energy.pue / 3.6e6
        out.energy_usd = out.energy_kwh * inp.energy.usd_per_kwh
    hours = out.expected_time_to_train_s / 3600.0
    if job.rent_usd_per_gpu_hour is not None:
        out.compute_usd = job.rent_usd_per_gpu_hour * (job.n_gpus + spares * job.gpus_per_node) * hours
    elif job.capex_usd is not None:
        years = inp.amortization_years
        share = 1.0 if years is None else min(1.0, hours / (years * 365.25 * 24))
        out.compute_usd = job.capex_usd * share
    if job.rent_usd_per_gpu_hour is not None:  # a rental rate includes the power (cloud prices do)
        out.energy_usd = 0.0 if out.energy_usd is not None else None
        out.expected_cost_usd = out.compute_usd
    elif out.compute_usd is not None or out.energy_usd is not None:
        out.expected_cost_usd = (out.compute_usd or 0.0) + (out.energy_usd or 0.0)


def node_rated_w(system) -> float | None:
    """A node's nameplate power, W: the system's `node_power_w`, else its GPUs' TDP times the DGX ratio
    (`goodput.yaml` power.rated_of_gpu_tdp); None when neither is stated."""
    if system.node_power_w is not None:
        return system.node_power_w
    if system.tdp_w is None:
        return None
    return system.gpus_per_node * system.tdp_w * defaults()["power"]["rated_of_gpu_tdp"]


def problem_spares(problem, n_gpus):
    """Spare nodes of a plan on n_gpus (scalar or array): the problem's `goodput.spare_nodes` plus the plan's
    idle whole nodes; None: a shared pool (no waits)."""
    g = problem.goodput
    if g is None or g.spare_count() is None:
        return None
    if not g.idle_nodes_are_spares:
        return g.spare_count() + 0 * np.asarray(n_gpus)
    idle = (problem.num_gpus - np.asarray(n_gpus)) // problem.system.gpus_per_node
    return g.spare_count() + idle


def problem_inputs(problem) -> Inputs:
    return Inputs.of(problem.goodput, problem.system.reliability)


def problem_factor(problem, n_gpus) -> np.ndarray:
    """`job_factor` of a `Problem` for each GPU count in n_gpus (the `expected_time` objective)."""
    shape = np.shape(n_gpus)
    n = np.atleast_1d(np.asarray(n_gpus))
    uniq, inv = np.unique(n, return_inverse=True)
    t = problem.training
    c = checkpoint_bytes(problem.llm, t.precision, t.master_weights)
    spares = problem_spares(problem, uniq)
    f = job_factor(problem_inputs(problem), c, uniq, problem.system.gpus_per_node, spares)
    return f[inv].reshape(shape)


BUSY_PARTS = ("fw", "bw", "recompute", "head", "optimizer", "overlap_slowdown", "fsdp_copies")


def busy_share(result: dict) -> float:
    """The share of a step (`optimizer.model.step` row) its GPUs compute: forward, backward, recompute, head,
    optimizer, compute slowed by overlapped communication, FSDP copies; the rest waits (exposed
    communication, bubble, offload, host)."""
    step = result["step_time"]
    return min(1.0, sum(result.get(k, 0.0) for k in BUSY_PARTS) / step) if step > 0 else 1.0


def of_problem(problem, n_gpus: int, step_s: float, busy: float = 1.0) -> PlanGoodput | None:
    """`expected` of a plan of a `Problem` on n_gpus GPUs at step_s (its GPUs busy for the share `busy` of
    a step); None without training.tokens."""
    steps = problem.steps_to_train()
    if not steps:
        return None
    t = problem.training
    spares = problem_spares(problem, n_gpus)
    job = Job(
        checkpoint_bytes=checkpoint_bytes(problem.llm, t.precision, t.master_weights),
        n_gpus=int(n_gpus),
        gpus_per_node=problem.system.gpus_per_node,
        step_s=float(step_s),
        steps=steps,
        spare_nodes=None if spares is None else int(spares),
        node_rated_w=node_rated_w(problem.system),
        rent_usd_per_gpu_hour=problem.goodput.rent_usd_per_gpu_hour if problem.goodput else None,
        busy_share=busy,
    )
    return expected(problem_inputs(problem), job)
