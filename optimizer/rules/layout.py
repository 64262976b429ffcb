"""Where the legality of a parallel layout lives: the integer rules and the placement on network tiers.

Everything that decides whether a plan is *legal* (not whether it fits in memory: that is the model's
`optimizer.model.capacity`) is written here once and called by every other stage: `validate` (messages
on the user's execution), `space` (the solver's candidate domains and legal triples), the CP-SAT
explanation model of `paraplan check` (`formulations.rules`) and the ZeRO rule of the formulation.

Parallel axes (`optimizer.schema.Axis` has the glossary), in Megatron-Core's rank order, innermost first:

    tp   tensor parallelism: each layer's matrices split over tp ranks (Shoeybi et al. 2019)
    cp   context parallelism: the sequence split over cp ranks, K/V exchanged in a ring
    ep   expert parallelism (MoE): the experts split over ep ranks, drawn from tp x cp x dp
    dp   data parallelism: replicas of the model (ZeRO shards state over them)
    pp   pipeline parallelism: layers split into pp stages (vpp chunks each when interleaved)

Rule groups (`Group`), each a vectorised predicate over candidate arrays (`rule_masks`):

    rules.gpus        tp*pp*dp*cp equals the GPU count (at most, with options.allow_idle_gpus), and is a
                      multiple of options.gpu_multiple
    rules.tp_split    tp divides the heads and the ffn; the K/V heads divisible by tp or tp by them
    rules.layers      pp*vpp divides the layers (layers + 2 when the embedding and the loss take a
                      pipeline slot each, Megatron-Core account_for_embedding/loss_in_pipeline_split);
                      vpp > 1 and that split need pp > 1
    rules.interleave  interleaved 1F1B (vpp > 1): the micro-batch count is a multiple of pp
    rules.batch       dp*micro_batch divides the global batch
    rules.context     2*cp divides the sequence (load-balanced causal attention); a2a context
                      parallelism (Ulysses) splits the heads: tp*cp divides the q and the K/V heads
                      (a2a_p2p: tp times its all-to-all degree, `cp_a2a_degree`)
    rules.experts     MoE: ep divides the experts, etp divides tp and the expert ffn, ep*etp divides
                      the tp*cp*dp ranks of a stage (Megatron-Core parallel folding), and equals tp*cp
                      with data parallelism outermost and pp > 1; dense: ep = 1, etp = tp
    network.must_fill the axes placed on a tier marked must_fill tile it
    caps.cp           a default cap of the search (`Caps`), lifted by naming cp in `search`

With idle GPUs allowed, every layout of at most num_gpus GPUs that satisfies the other rules is legal:
no axis is restricted to the divisors of the GPU count. Domains are built from divisors of the model's
sizes (found by factorisation), never by scanning up to a number's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from optimizer.schema.stack import Stack

if TYPE_CHECKING:
    from optimizer.schema import Problem, System


class Group(StrEnum):
    """Named rule groups: the words `validate`, `check` and the solver share (module docstring)."""

    GPUS = "rules.gpus"
    TP_SPLIT = "rules.tp_split"
    LAYERS = "rules.layers"
    INTERLEAVE = "rules.interleave"
    BATCH = "rules.batch"
    CONTEXT = "rules.context"
    EXPERTS = "rules.experts"
    MUST_FILL = "network.must_fill"
    CAP_CP = "caps.cp"


@dataclass(frozen=True)
class Caps:
    """Default caps of the search space: they keep the space small where larger values never win in the
    model, and are lifted for an axis that `search` names (`search: {cp: 64}` or `{cp: {max: 64}}`).

    cp_max: context-parallel degree at most 32 (the K/V ring's latency and the per-rank attention tiles
        shrink below any benefit; published runs use cp <= 32).
    dense_cp_max / dense_cp_long_seq: a dense model uses cp <= 8 unless the sequence has at least 32768
        tokens (below that, Megatron-Core recipes use cp <= 2-4 on dense models).
    """

    cp_max: int = 32
    dense_cp_max: int = 8
    dense_cp_long_seq: int = 32768

    def cp_limit(self, problem: Problem) -> int:
        if problem.llm.moe is None and problem.seq_len < self.dense_cp_long_seq:
            return min(self.cp_max, self.dense_cp_max)
        return self.cp_max


CAPS = Caps()


# --------------------------------------------------------------------------------------------- divisors
@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    f, m, p = {}, n, 2
    while p * p <= m:  # trial division by primes up to sqrt(n): O(sqrt(n)) at worst, fast for n < 2^62
        while m % p == 0:
            f[p] = f.get(p, 0) + 1
            m //= p
        p += 1 if p == 2 else 2
        if p > 1_000_000:  # a huge prime factor: the remaining cofactor is treated as prime
            break
    if m > 1:
        f[m] = f.get(m, 0) + 1
    out = [1]
    for q, e in f.items():
        out = [d * q**i for d in out for i in range(e + 1)]
    return tuple(sorted(out))


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order (by factorisation; n >= 1)."""
    n = int(n)
    return list(_divisors(n)) if n >= 1 else []


def _upto(vals, n: int) -> list[int]:
    return sorted({int(v) for v in vals if 1 <= v <= n})


# --------------------------------------------------------------------------------------------- domains
def uneven_vpps(blocks: int, pps) -> set[int]:
    """The vpp an uneven split (a custom layout) of `blocks` (the layers and the MTP modules' blocks,
    `Problem.pipeline_blocks`; + 2 with the embedding and loss slots) over each pp of `pps` can interleave
    with: the divisors of its busiest stage's ceil(slots / pp) (`compose.split_slots`)."""
    return {v for s in (blocks, blocks + 2) for q in pps if q > 1 for v in divisors(-(-s // q))}


def uneven_searched(problem: Problem) -> bool:
    """Whether the problem's `search` admits uneven pipeline splits (`Search.pp_uneven` names true)."""
    rule = problem.user_search_rules().get("pp_uneven")
    return rule is True or (isinstance(rule, list) and True in rule)


def axis_values(problem: Problem, knob: str) -> list[int]:
    """Values of an integer knob that its own rules allow (before caps, `search` and cross-knob rules):
    tp divides the heads (and the ffn, the K/V split), pp divides the layers or layers + 2 (with uneven
    splits searched, any count up to layers + 2), cp splits the sequence, dp divides the batch, ep divides
    the experts, etp the expert ffn; every degree is at most the GPU count, and a divisor of it unless idle
    GPUs are allowed. vpp divides the layers or layers + 2 (uneven: or some stage's ceil(slots / pp))."""
    p, llm = problem, problem.llm
    n, B, S = p.num_gpus, p.training.global_batch, p.seq_len
    idle = p.options.allow_idle_gpus

    def deg(vals):
        vals = _upto(vals, n)
        return vals if idle else [v for v in vals if n % v == 0]

    if knob == "tp":
        return deg(
            t for t in divisors(llm.heads) if llm.ffn % t == 0 and (llm.kv % t == 0 or t % llm.kv == 0)
        )
    uneven = uneven_searched(problem)
    if knob == "pp":
        even = set(divisors(llm.layers)) | {q for q in divisors(llm.layers + 2) if q > 1}
        return deg(even | (set(range(2, llm.layers + 3)) if uneven else set()))
    if knob == "cp":
        return deg(divisors(S // 2)) if S >= 2 else [1]
    if knob == "dp":
        return deg(divisors(B))
    if knob == "ep":
        return _upto(divisors(llm.moe.experts), n) if llm.moe else [1]
    if knob == "etp":
        return deg(divisors(llm.moe.expert_ffn)) if llm.moe else []
    if knob == "vpp":
        extra = uneven_vpps(p.pipeline_blocks, range(2, llm.layers + 3)) if uneven else set()
        return sorted(set(divisors(llm.layers)) | set(divisors(llm.layers + 2)) | extra)
    if knob == "micro_batch":
        return divisors(B)
    raise KeyError(knob)


def capped(problem: Problem, knob: str, values: list[int]) -> list[int]:
    """`values` within the default caps (`CAPS`), unless `search` names the knob (then it is lifted)."""
    if knob == "cp" and problem.search_rules().get("cp") is None:
        lim = CAPS.cp_limit(problem)
        return [v for v in values if v <= lim]
    return values


# --------------------------------------------------------------------------------------------- placement
def domain_fill(used, n_job):
    """Per tier, the GPUs of one job in each of its domains: the GPUs it uses per domain (`Network.used`),
    or the whole job where it is smaller; an array with a trailing tier axis (broadcast over `n_job`). A
    tier given as 0 (`domain_used`: a must-fill tier, whose rule rejects groups that do not tile it) is
    0: every span divides it."""
    n = np.asarray(n_job, dtype=np.int64)
    return np.minimum(np.asarray(used, dtype=np.int64).reshape((1,) * n.ndim + (-1,)), n[..., None])


def innermost_tier(sizes, span, fill=None):
    """Index of the innermost tier whose domain holds every group of `span` consecutive ranks (the outermost
    when none does); vectorised over `span`. With `fill` (`domain_fill`: a job's GPUs per domain, by tier) a
    domain holds them only when `span` divides its fill: consecutive ranks fill each domain in turn, so
    otherwise some group straddles two domains (and its collectives cross the next tier)."""
    sz = np.asarray(sizes)
    span = np.asarray(span)
    fits = sz.reshape((1,) * span.ndim + (-1,)) >= span[..., None]
    if fill is not None:
        fits = fits & (np.asarray(fill) % span[..., None] == 0)
    out = np.where(fits.any(axis=-1), fits.argmax(axis=-1), len(sizes) - 1)
    return int(out) if out.ndim == 0 else out


def tier_index(system: System, value: str | int) -> int:
    """Index of a network tier named in a placement (its name in `system.networks`, or its index)."""
    if isinstance(value, int):
        if not 0 <= value < len(system.networks):
            raise ValueError(f"tier {value} out of range (0..{len(system.networks) - 1})")
        return value
    names = [n.name for n in system.networks]
    if value not in names:
        raise ValueError(f"unknown network '{value}' (system has {', '.join(names)})")
    return names.index(value)


def placement(sizes, tp, cp, dp, pp, ep=1, etp=None, used=None, dp_last=False) -> dict[str, np.ndarray | int]:
    """Default tier of each axis (Megatron rank order tp, cp, dp, pp, innermost first; `dp_last`: tp, cp, pp,
    dp, `RankOrder.TP_CP_PP_DP`): the innermost tier whose domains hold the groups of the product of the
    axis' degree and all inner ones; an axis of degree 1 sits on tier 0. MoE layers reuse the same ranks in
    the order etp, ep, edp, pp (Megatron-Core; etp, ep, pp, edp with `dp_last`): the EP group spans etp*ep
    consecutive ranks and does not add to the product. `used`: the GPUs a job uses per domain of each tier
    (`Network.used`; null: every GPU of `sizes`): a group stays in a domain only when it divides the job's
    GPUs there (`innermost_tier`). Vectorised; scalars in, ints out."""
    etp = tp if etp is None else etp
    n_job = np.asarray(tp) * np.asarray(cp) * np.asarray(dp) * np.asarray(pp)
    fill = domain_fill(sizes if used is None else used, n_job)
    out, cum = {}, 1
    order = (
        (("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp))
        if dp_last
        else (("tp", tp), ("cp", cp), ("dp", dp), ("pp", pp))
    )
    for ax, d in order:
        cum = np.asarray(cum) * np.asarray(d)
        out[ax] = np.where(np.asarray(d) > 1, innermost_tier(sizes, cum, fill), 0)
    span_ep = np.asarray(ep) * np.asarray(etp)
    out["ep"] = np.where(np.asarray(ep) > 1, innermost_tier(sizes, span_ep, fill), 0)
    return {k: (int(v) if np.ndim(v) == 0 else v) for k, v in out.items()}


def dp_last(ex) -> bool:
    """Whether an execution numbers data parallelism outermost (`Execution.rank_order` tp-cp-pp-dp)."""
    from optimizer.schema.common import RankOrder

    return ex.rank_order == RankOrder.TP_CP_PP_DP


def domain_used(system) -> list[int]:
    """GPUs a job uses per domain of each of the system's tiers (`Network.used`), for `placement`; 0 on a
    must-fill tier, where a group that does not tile the domain is not moved to the next tier but
    rejected (`must_fill_ok`)."""
    return [0 if x.must_fill else x.used for x in system.networks]


def tier_spans(sizes, tiers: dict, tp, cp, dp, pp) -> list:
    """Per tier i: the product of the degrees of the axes placed on tier i or an inner one (the GPUs a
    group on that tier spans)."""
    spans = []
    for i in range(len(sizes)):
        prod = 1
        for ax, d in (("tp", tp), ("cp", cp), ("dp", dp), ("pp", pp)):
            prod = prod * np.where(np.asarray(tiers[ax]) <= i, np.asarray(d), 1)
        spans.append(prod)
    return spans


def must_fill_ok(networks, tiers: dict, tp, cp, dp, pp):
    """network.must_fill: the groups placed on a must-fill tier tile it (its size a multiple of their
    span)."""
    ok = np.ones(
        np.broadcast(np.asarray(tp), np.asarray(pp), np.asarray(dp), np.asarray(cp)).shape, dtype=bool
    )
    spans = tier_spans([x.size for x in networks], tiers, tp, cp, dp, pp)
    for net, span in zip(networks, spans, strict=True):
        if net.must_fill:
            ok = ok & (net.size % span == 0)
    return ok


# --------------------------------------------------------------------------------------------- rules
def _experts_ok(p: Problem, tp, pp, dp, cp, ep, etp):
    """rules.experts (module docstring), vectorised."""
    mo = p.llm.moe
    if mo is None:
        return (ep == 1) & (etp == tp)
    return (
        (mo.experts % ep == 0)
        & (tp % etp == 0)
        & (mo.expert_ffn % etp == 0)
        & ((tp * cp * dp) % (ep * etp) == 0)
        # data parallelism outermost with a pipeline: the expert and dense DP sizes are equal
        # (Megatron-Core parallel_state: "When not using pp-last rank ordering ...")
        & (~np.asarray(dp_last(p.execution)) | (pp == 1) | (ep * etp == tp * cp))
    )


def rule_masks(
    problem: Problem,
    tp,
    pp,
    dp,
    cp,
    vpp=1,
    micro_batch=1,
    ep=1,
    etp=None,
    pp_embedding_loss=0,
    pp_uneven=0,
    searched: bool = False,
) -> dict[Group, np.ndarray]:
    """Each rule group's verdict (True: satisfied) on candidate arrays (broadcast together). An uneven split
    (`pp_uneven`) needs pp*vpp chunks of at least a slot each; `searched`: as the solver's space has it, also
    vpp dividing the busiest stage's ceil(slots / pp) (`optimizer.prepare.space.compact_space`)."""
    p, llm = problem, problem.llm
    tp, pp, dp, cp, vpp, mb, ep, el = (
        np.asarray(x, dtype=np.int64) for x in (tp, pp, dp, cp, vpp, micro_batch, ep, pp_embedding_loss)
    )
    etp = tp if etp is None else np.asarray(etp, dtype=np.int64)
    n, B, S, L = p.num_gpus, p.training.global_batch, p.seq_len, llm.layers
    used = tp * pp * dp * cp
    gpus = (used <= n) if p.options.allow_idle_gpus else (used == n)
    gpus = gpus & (used % p.options.gpu_multiple == 0)
    tp_split = (llm.heads % tp == 0) & (llm.ffn % tp == 0) & ((llm.kv % tp == 0) | (tp % llm.kv == 0))
    el_b = el.astype(bool)
    slots = L + 2 * el
    # a custom layout (pp_uneven) also places the MTP modules' blocks, all in the last chunk with the loss
    # (Megatron-Core's layout rules)
    mtp = p.mtp_layers
    blocks = slots + mtp
    custom = np.asarray(pp_uneven, dtype=bool) & (pp > 1)
    chunk = -(-blocks // np.maximum(pp * vpp, 1))
    uneven = custom & (blocks >= pp * vpp) & ((mtp == 0) | (chunk >= mtp + el))
    if searched:
        uneven = uneven & ((-(-blocks // np.maximum(pp, 1))) % vpp == 0)
    split = np.where(custom, uneven, slots % (pp * vpp) == 0)
    layers = split & ~((vpp > 1) & (pp == 1)) & ~(el_b & (pp == 1))
    batch = B % (dp * mb) == 0
    n_mb = np.where(batch, B // np.maximum(dp * mb, 1), 0)
    # an interleaved schedule, and MaxText's pipeline whatever its repeats (its config check:
    # num_pipeline_microbatches % num_stages == 0), needs the micro-batches in whole rounds of the stages
    interleave = ((vpp == 1) & (p.stack != Stack.MAXTEXT)) | (n_mb % pp == 0)
    context = (cp == 1) | (S % (2 * cp) == 0)
    experts = _experts_ok(p, tp, pp, dp, cp, ep, etp)
    tiers = placement(
        [x.size for x in p.system.networks],
        tp,
        cp,
        dp,
        pp,
        ep,
        etp,
        used=domain_used(p.system),
        dp_last=dp_last(p.execution),
    )
    fill = must_fill_ok(p.system.networks, tiers, tp, cp, dp, pp)
    return {
        Group.GPUS: gpus,
        Group.TP_SPLIT: tp_split,
        Group.LAYERS: layers,
        Group.INTERLEAVE: interleave,
        Group.BATCH: batch,
        Group.CONTEXT: context,
        Group.EXPERTS: experts,
        Group.MUST_FILL: fill,
    }


def legal(problem: Problem, **knobs) -> np.ndarray:
    """True where every rule group holds (`rule_masks`)."""
    masks = rule_masks(problem, **knobs)
    out = None
    for m in masks.values():
        out = m if out is None else out & m
    return out


def cp_a2a_degree(tp, cp, domain_gpus):
    """The all-to-all degree of hierarchical (a2a_p2p) context parallelism: the cp ranks that share one
    innermost (NVLink) domain, cp ranks being tp apart, as a divisor of cp (gcd). Works on arrays."""
    tp, cp = np.asarray(tp, dtype=np.int64), np.asarray(cp, dtype=np.int64)
    return np.gcd(cp, np.maximum(np.asarray(domain_gpus, dtype=np.int64) // tp, 1))


def cp_comm_codes(
    heads: int, kv_heads: int, tp: int, cp: int, domain_gpus: int, allowed: frozenset | None = None
) -> list[int]:
    """Codes (`CP_COMM_CODES`) of the K/V exchanges legal for one layout: without context parallelism only
    p2p (the knob is moot); else p2p, all_gather, a2a when tp*cp divides the q and the K/V heads, a2a_p2p
    when its all-to-all degree a is strictly between 1 and cp (else it is p2p or a2a) and tp*a divides the
    heads; only those in `allowed` when the model's attention limits them (`cp_comm_limits`)."""
    if cp == 1:
        return [0]
    out = [0, 1]
    if heads % (tp * cp) == 0 and kv_heads % (tp * cp) == 0:
        out.append(2)
    a = int(cp_a2a_degree(tp, cp, domain_gpus))
    if 1 < a < cp and heads % (tp * a) == 0 and kv_heads % (tp * a) == 0:
        out.append(3)
    return [c for c in out if allowed is None or c in allowed]


def cp_comm_limits(llm, stack) -> tuple[frozenset | None, str]:
    """The CP exchanges (codes) Transformer Engine runs the model's attention with, and why, or (None, "")
    when any: learned softmax sinks only with a2a (context_parallel.py asserts softmax_type vanilla or
    a2a; TransformerEngine #2541), sliding windows only with all_gather or a2a ("The default cp_comm_type
    'p2p' does not work with sliding window attention", Megatron-LM PR #1160; "compatible with both
    all_gather and a2a", Megatron-LM #2222). Other stacks run their own ring."""
    if str(getattr(stack, "value", stack)) != "megatron-core":
        return None, ""
    if llm.attention_sinks:
        return frozenset({2}), "attention sinks (learnable softmax) run with a2a context parallelism only"
    if llm.sliding_window is not None:
        return frozenset(
            {1, 2}
        ), "sliding-window attention runs with all_gather or a2a context parallelism only"
    return None, ""


def has_dp_group(dp_cp, edp):
    """Whether there is a data-parallel group to reduce gradients over and shard state across: dp*cp > 1
    ranks, or, MoE, an expert-data-parallel group of edp = tp*cp*dp/(ep*etp) > 1 ranks (Megatron-Core)."""
    return (np.asarray(dp_cp) > 1) | (np.asarray(edp) > 1)


def zero_allowed(z, no_dp_group):
    """Whether ZeRO stage `z` is legal: stage 0 always, a stage above 0 only with a data-parallel group to
    shard over (`no_dp_group` false; `has_dp_group`). Works on scalars and arrays."""
    return (np.asarray(z) == 0) | ~np.asarray(no_dp_group, dtype=bool)


def dp_overlap_allowed(on, no_dp_group, pipelined, on_offered, overlaps_pipelined=True):
    """Whether the DP-overlap flag `on` is legal: without a data-parallel group the flag is moot and set on
    (where on is offered at all), except in a pipelined layout (`pipelined`: pp > 1) of a stack that never
    overlaps a pipelined reduction (`overlaps_pipelined` false: `stack.overlaps_pipelined_dp`), where it is
    off, moot or not. Works on scalars and arrays."""
    on, no_dp_group = np.asarray(on, dtype=bool), np.asarray(no_dp_group, dtype=bool)
    off_here = np.asarray(pipelined, dtype=bool) & (not overlaps_pipelined)
    return ((~no_dp_group) | on | off_here | (not on_offered)) & ~(off_here & on)


# knob -> the layouts where it has no effect: tp == 1, pp == 1, no data-parallel group, ep == 1
_MOOT_WHEN = {
    "sequence_parallel": ("tp",),
    "sp_ag_redo": ("tp",),
    "tp_overlap": ("tp",),
    "pp_rs_ag": ("tp", "pp"),
    "schedule": ("pp",),
    "vpp": ("pp",),
    "pp_embedding_loss": ("pp",),
    "zero": ("dp",),
    "dp_overlap": ("dp",),
    "moe_dispatcher": ("ep",),
    "ep_overlap": ("ep",),
    "cp_comm": ("cp",),
}


def moot(knob: str, tp: int, pp: int, no_dp: bool = False, no_ep: bool = False, no_cp: bool = False) -> bool:
    """Whether `knob` has no effect in a layout: the TP knobs without tensor parallelism, the pipeline knobs
    without a pipeline (pp_rs_ag needs both), ZeRO and DP overlap without a data-parallel group, the MoE
    dispatcher and all-to-all overlap without expert parallelism, the CP exchange without context
    parallelism. The solver keeps one value of a moot knob (`space`), and a stack's missing knob is not
    reported where it is moot."""
    off = {"tp": tp == 1, "pp": pp == 1, "dp": bool(no_dp), "ep": bool(no_ep), "cp": bool(no_cp)}
    return any(off[a] for a in _MOOT_WHEN.get(knob, ()))
