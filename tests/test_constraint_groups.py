"""One tiny feasible and one tiny infeasible problem per named constraint group, in the cpsat-primer style.

`paraplan check` explains an infeasible problem by naming constraint groups. The integer rule groups
(`optimizer.rules.layout.Group`: rules.gpus, rules.tp_split, rules.layers, rules.interleave, rules.batch,
rules.context, rules.experts, network.must_fill, caps.cp) are posted by `formulations.rules` as CP-SAT
constraints, each enforced by its own literal; `formulations.rules.conflict` returns a minimal set of
literals that cannot hold together (sufficient assumptions shrunk by a deletion filter). The group
memory.hbm (the smallest HBM per GPU of any legal plan, `formulations.fit`) and objective.target (a
step-time target no plan that fits meets) are named by `optimizer.drivers.check.check`.

Each row of `CASES` is a twin pair on a 4-layer, 12-head toy model (`BASE`): a feasible problem and an
infeasible one that differs from it in one value and fails because of the row's group. The test asserts
that the feasible twin has no conflict and that the infeasible twin's minimal conflict is exactly the row's
groups: the group under test plus `fixed.<knob>` for the knobs the twin fixes in `search`, and the one rule
group it is defined against: rules.batch for rules.interleave (the micro-batch count exists only where
dp*micro_batch divides the global batch) and rules.gpus for caps.cp (only the GPU count pushes cp past its
cap). The rule rows call `formulations.rules.conflict` directly (one small CP-SAT model, a few ms); only
the memory and target rows run `check`, whose solves stay cheap on the toy model. The whole file is part
of the fast test set (a few seconds of CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from formulations import rules
from optimizer.drivers.check import check, fixed_knobs, with_fixed
from optimizer.io.loader import Sourced, parse_yaml, resolve_document, validate_problem
from optimizer.rules.layout import Group

# Head dimension 32; 12 heads admit tp in {1, 2, 3, 4, 6, 12}; 4 layers admit pp*vpp in {1, 2, 4} (and 3, 6
# with the embedding and loss as pipeline slots).
BASE = """
name: toy
llm: {name: toy, hidden: 384, ffn: 1536, layers: 4, heads: 12, seq_len: 1024, vocab: 1000}
system: {base: a100-sxm-80gb}
num_gpus: 8
training: {global_batch: 8}
options: {memory_headroom_gib: 0}
"""

# A node tier of 4 GPUs that must be filled: the axes placed on it must tile it.
MUST_FILL = """
num_gpus: 12
training: {{global_batch: 12}}
system:
  base: a100-sxm-80gb
  gpus_per_node: 4
  networks:
    - {{name: nvlink, size: 4, bandwidth_gbps: 300, latency_us: 2, efficiency: 0.8, must_fill: true}}
    - {{name: ib, size: 1024, bandwidth_gbps: 25, latency_us: 5, efficiency: 0.8}}
search: {{tp: {tp}}}
"""

MOE = "llm: {{moe: {{experts: 4, top_k: 2, expert_ffn: 512}}}}\nsearch: {{ep: {ep}}}"


@dataclass(frozen=True)
class Case:
    group: str
    why: str  # why the infeasible twin fails
    feasible: str  # YAML merged over BASE
    infeasible: str  # YAML merged over BASE
    conflict: tuple[str, ...]  # the minimal conflict of the infeasible twin


CASES = [
    Case(
        Group.GPUS,
        "tp*pp = 16 exceeds the 8 GPUs",
        "search: {tp: 2, pp: 2}",
        "search: {tp: 4, pp: 4}",
        ("rules.gpus", "fixed.tp", "fixed.pp"),
    ),
    Case(
        Group.TP_SPLIT,
        "tp = 8 does not divide the 12 heads",
        "search: {tp: 4}",
        "search: {tp: 8}",
        ("rules.tp_split", "fixed.tp"),
    ),
    Case(
        Group.LAYERS,
        "pp = 8 divides neither the 4 layers nor 4 + 2 slots",
        "search: {pp: 4}",
        "search: {pp: 8}",
        ("rules.layers", "fixed.pp"),
    ),
    Case(
        Group.INTERLEAVE,
        "micro-batch 2 leaves 6 / (2 dp) = 3 or 1 micro-batches (dp 1 or 3), not a multiple of pp = 2",
        "{num_gpus: 6, training: {global_batch: 6}, search: {pp: 2, vpp: 2, micro_batch: 1}}",
        "{num_gpus: 6, training: {global_batch: 6}, search: {pp: 2, vpp: 2, micro_batch: 2}}",
        ("rules.interleave", "rules.batch", "fixed.pp", "fixed.vpp", "fixed.micro_batch"),
    ),
    Case(
        Group.BATCH,
        "a micro-batch of 16 does not divide the global batch 8",
        "search: {micro_batch: 8}",
        "search: {micro_batch: 16}",
        ("rules.batch", "fixed.micro_batch"),
    ),
    Case(
        Group.CONTEXT,
        "2*cp = 16 does not divide 1000 tokens",
        "{training: {seq_len: 1000}, search: {cp: 4}}",
        "{training: {seq_len: 1000}, search: {cp: 8}}",
        ("rules.context", "fixed.cp"),
    ),
    Case(
        Group.EXPERTS,
        "ep = 8 does not divide the 4 experts",
        MOE.format(ep=4),
        MOE.format(ep=8),
        ("rules.experts", "fixed.ep"),
    ),
    Case(
        Group.MUST_FILL,
        "tp = 3 cannot tile a 4-GPU node",
        MUST_FILL.format(tp=2),
        MUST_FILL.format(tp=3),
        ("network.must_fill", "fixed.tp"),
    ),
    Case(
        Group.CAP_CP,
        "tp = pp = dp = 1 on 16 GPUs leaves cp = 16, past the default cap of 8",
        "{num_gpus: 8, search: {tp: 1, pp: 1, dp: 1}}",
        "{num_gpus: 16, search: {tp: 1, pp: 1, dp: 1}}",
        ("caps.cp", "rules.gpus", "fixed.tp", "fixed.pp", "fixed.dp"),
    ),
    Case(
        "memory.hbm",
        "every plan needs about 1.5 GiB per GPU (mostly the runtime reserve); the GPU has 1 GiB",
        "system: {hbm_gib: 2}",
        "system: {hbm_gib: 1}",
        ("memory.hbm",),
    ),
    Case(
        "objective.target",
        "the fastest plan takes about 2.6 ms per step; the target is 1 ms",
        "objective: {goal: step_time, max_step_time_s: 1.0}",
        "objective: {goal: step_time, max_step_time_s: 0.001}",
        ("objective.target",),
    ),
]


def merge(base, over):
    """`over` merged into `base`: mappings key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: merge(base[k], v) if k in base else v for k, v in over.items()}}
    return over


def load(text: str):
    """The problem BASE overlaid with `text`, and the execution keys it writes (none here)."""
    data = merge(parse_yaml(BASE).data, parse_yaml(text).data)
    doc = resolve_document(Sourced(data, {}, "<case>"), Path(__file__).parent)
    return validate_problem(doc), None


def conflict(group: str, text: str) -> list[str] | None:
    """The infeasible problem's minimal conflict (None: it is feasible). Rule groups: the CP-SAT rules
    model (`formulations.rules.conflict`) over the problem with its `search` knobs fixed, as `check` builds
    it; memory and target: `check`."""
    problem, written = load(text)
    if group in set(Group):
        fixed = fixed_knobs(problem, written)
        core = rules.conflict(with_fixed(problem, fixed), fixed)
        if core is not None:  # every named group has words for the explanation
            assert all(rules.describe(problem, g, fixed) for g in core)
        return core
    r = check(problem, written)
    return None if r.fits else [g for g, _ in r.conflicts]


def test_every_rule_group_has_a_case():
    assert set(Group) <= {c.group for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[str(c.group) for c in CASES])
def test_group_feasible_and_infeasible_twin(case: Case):
    assert conflict(case.group, case.feasible) is None
    core = conflict(case.group, case.infeasible)
    assert core is not None, f"{case.group}: the infeasible twin fits ({case.why})"
    assert sorted(core) == sorted(case.conflict), case.why
