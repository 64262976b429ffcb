"""`paraplan solve`: the fastest execution of a problem (stages prepare -> build -> solve -> extract ->
verify). Methods: ``enumerate`` walks the whole space with the vectorised model (the oracle); ``cpsat``
(the CP-SAT formulation in `formulations/`) proves the same optimum without walking it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .errors import Infeasible, VerificationError
from .evaluate import Evaluation, evaluate_execution
from .model.knobs import to_execution
from .schema import Problem
from .space import build_space

REL_TOL = 1e-3  # solver objective vs re-evaluated step time


@dataclass
class Plan:
    evaluation: Evaluation
    objective_s: float  # what the method reported


@dataclass
class SolveResult:
    method: str
    status: str  # optimal | feasible
    plans: list[Plan]
    candidates: int
    feasible_candidates: int | None
    seconds: float
    bound_s: float | None = None
    gap: float | None = None
    notes: list[str] = field(default_factory=list)


def verify(problem: Problem, ev: Evaluation, objective_s: float) -> None:
    """Re-evaluate with the model: objective within 0.1% and every capacity holds, or fail loudly."""
    t = ev.result["step_time"]
    if abs(t - objective_s) > REL_TOL * t:
        raise VerificationError(f"solver objective {objective_s:.6g} s disagrees with the model's {t:.6g} s "
                                f"for {ev.execution.model_dump(mode='json')}")
    if not ev.fits:
        raise VerificationError(f"plan does not fit in memory when re-evaluated: {ev.result['hbm'] / 2**30:.2f} GiB")


def solve(problem: Problem, method: str = "cpsat", top: int = 1, time_limit_s: float = 60.0,
          params: dict | None = None, backend: str = "cpsat", solver: str = "highs") -> SolveResult:
    t0 = time.perf_counter()
    if backend == "pyomo" and method == "cpsat":  # the same kept pairs as a MILP (formulations.pyomo_model)
        from formulations.pyomo_model import solve_pyomo

        return solve_pyomo(problem, top=top, time_limit_s=time_limit_s, t0=t0, solver=solver)
    if method == "cpsat":
        from formulations.model import solve_cpsat
        from formulations.tables import Unsupported

        try:
            return solve_cpsat(problem, top=top, time_limit_s=time_limit_s, t0=t0, params=params)
        except Unsupported as e:  # solved exactly all the same, by the oracle, and said so
            r = solve(problem, "enumerate", top=top)
            r.notes.append(f"CP-SAT formulation does not cover this problem ({e}); solved by enumeration")
            return r
    if method == "enumerate":
        from .enumerate import enumerate_best

        r = enumerate_best(problem, build_space(problem), top=top)
        if len(r.step_time_s) == 0:
            what = "meets the objective's target" if r.n_feasible else "is within memory"
            raise Infeasible(f"nothing fits: none of {r.n_candidates:,} candidates {what} "
                             "(run `paraplan check` for why and what would fit)",
                             reason="rules" if r.n_candidates == 0 else "target" if r.n_feasible else "memory")
        plans = []
        for i in range(len(r.step_time_s)):
            ex = to_execution(r.knobs, problem.system, i)
            ev = evaluate_execution(problem, ex)
            verify(problem, ev, float(r.step_time_s[i]))
            plans.append(Plan(ev, float(r.step_time_s[i])))
        from .objective import describe, gpus_used

        note = describe(problem, gpus_used(plans[0].evaluation.execution), plans[0].objective_s)
        step_goal = problem.objective.goal.value == "step_time"
        return SolveResult("enumerate", "optimal", plans, r.n_candidates, r.n_feasible,
                           time.perf_counter() - t0, bound_s=float(r.step_time_s[0]) if step_goal else None,
                           gap=0.0, notes=[note])
    raise ValueError(f"unknown method {method}")


def megatron_args(problem: Problem, ev: Evaluation) -> list[str]:
    """Megatron-LM command-line arguments of a plan (Megatron-Core names, 2024)."""
    ex, llm, tr = ev.execution, problem.llm, problem.training
    a = [f"--tensor-model-parallel-size {ex.tp}", f"--pipeline-model-parallel-size {ex.pp}"]
    if ex.vpp > 1:
        a.append(f"--num-layers-per-virtual-pipeline-stage {llm.layers // (ex.pp * ex.vpp)}")
    if ex.cp > 1:
        a.append(f"--context-parallel-size {ex.cp}")
    a += [f"--micro-batch-size {ex.micro_batch}", f"--global-batch-size {tr.global_batch}",
          f"--num-layers {llm.layers}", f"--hidden-size {llm.hidden}", f"--ffn-hidden-size {llm.ffn}",
          f"--num-attention-heads {llm.heads}", f"--seq-length {problem.seq_len}",
          f"--max-position-embeddings {problem.seq_len}"]
    if llm.kv != llm.heads:
        a += ["--group-query-attention", f"--num-query-groups {llm.kv}"]
    if llm.mlp.value == "swiglu":
        a.append("--swiglu")
    if llm.mlp.value == "squared_relu":
        a.append("--squared-relu")
    if not llm.bias:
        a.append("--disable-bias-linear")
    if tr.precision.value in ("bf16", "fp8"):
        a.append("--bf16")
    if tr.precision.value == "fp16":
        a.append("--fp16")
    if tr.precision.value == "fp8":
        a.append("--fp8-format hybrid")
    if ex.sequence_parallel:
        a.append("--sequence-parallel")
    if ex.recompute.value == "selective":
        a.append("--recompute-granularity selective")
    elif ex.recompute.value == "full":
        a += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if ex.zero >= 1:
        a.append("--use-distributed-optimizer")
    if ex.zero >= 2:
        a.append("# ZeRO-2/3 have no Megatron-LM flag: use Megatron FSDP or torch FSDP for this plan")
    if ex.dp_overlap:
        a.append("--overlap-grad-reduce")
        if ex.zero >= 1:
            a.append("--overlap-param-gather")
    if ex.tp_overlap.value != "none":
        a.append("--tp-comm-overlap")
    if ex.attention.value == "flash":
        a.append("--use-flash-attn")
    if ex.weight_offload or ex.activation_offload or ex.optimizer_offload:
        a.append("# offload: " + ", ".join(n for n, on in (("weights", ex.weight_offload),
                 ("activations", ex.activation_offload), ("optimizer", ex.optimizer_offload)) if on))
        if ex.optimizer_offload:
            a += ["--optimizer-cpu-offload"]
    return a


def result_dict(problem: Problem, r: SolveResult) -> dict:
    from .report.text import evaluation_dict

    return {
        "method": r.method, "status": r.status, "solve_time_s": r.seconds, "candidates": r.candidates,
        "feasible_candidates": r.feasible_candidates, "bound_step_time_s": r.bound_s, "gap": r.gap,
        "plans": [evaluation_dict(p.evaluation) | {"objective_step_time_s": p.objective_s} for p in r.plans],
        "notes": r.notes,
    }


def render(problem: Problem, r: SolveResult, emit: str | None = None) -> str:
    from .report.text import render_evaluation

    out = [f"paraplan solve ({r.method}): {r.status}; {r.candidates:,} candidates in the space"
           + (f", {r.feasible_candidates:,} fit" if r.feasible_candidates is not None else "")
           + f"; solved in {r.seconds:.3f} s"]
    if r.bound_s is not None:
        out.append(f"best step time {r.plans[0].objective_s:.4f} s, bound {r.bound_s:.4f} s, gap {100 * (r.gap or 0):.3f}%")
    for i, p in enumerate(r.plans):
        out += ["", f"=== plan {i + 1} of {len(r.plans)}: step time {p.evaluation.result['step_time']:.4f} s ==="]
        out.append(render_evaluation(p.evaluation))
        if emit == "megatron":
            out += ["", "Megatron-LM arguments:", "  " + " \\\n  ".join(megatron_args(problem, p.evaluation))]
    for n in r.notes:
        out.append(f"note: {n}")
    return "\n".join(out)
