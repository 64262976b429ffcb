"""`paraplan evaluate`: one configuration through the analytical model, with warnings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optimizer.schema import Execution, Problem


@dataclass
class Evaluation:
    problem: Problem
    execution: Execution
    result: dict[str, float]
    fits: bool
    time_to_train_s: float | None
    warnings: list[str] = field(default_factory=list)
    goodput: Any = None  # optimizer.model.goodput.PlanGoodput with training.tokens, else None


def one_batch_only(problem: Problem, command: str) -> None:
    """Refuse a batch-size schedule where the command answers for one batch (bad input at training.phases)."""
    if problem.training.phases:
        raise problem_field_error(
            problem,
            "training.phases",
            f"{command} answers for one batch; `paraplan solve` plans each phase of a batch-size schedule "
            "(or give the phase's global_batch, seq_len and tokens without phases)",
        )


def evaluate_execution(problem: Problem, ex: Execution | None = None) -> Evaluation:
    from optimizer.model.knobs import from_execution, to_execution
    from optimizer.model.step import GIB, evaluate

    one_batch_only(problem, "evaluate")
    ex = ex or problem.execution
    if ex.rank_order != problem.execution.rank_order:  # the model reads the rank order from the problem
        problem = problem.model_copy(
            update={"execution": problem.execution.model_copy(update={"rank_order": ex.rank_order})}
        )
    k = from_execution(ex, problem.system, problem.num_gpus)
    r = evaluate(problem, k).row()
    full_ex = to_execution(k, problem.system, rank_order=problem.execution.rank_order)
    cap = (problem.system.hbm_gib - problem.headroom_gib()) * GIB
    fits = r["hbm"] <= cap
    from optimizer.rules.cross_field import execution_warnings

    warnings: list[str] = execution_warnings(problem.stack, full_ex, problem.training.precision)
    warnings += placement_warnings(problem, k.row())
    if not fits:
        warnings.append(
            f"does not fit: {r['hbm'] / GIB:.1f} GiB needed per GPU, {cap / GIB:.1f} GiB available"
        )
    off = problem.system.offload
    if r["offload_mem"] > off.capacity_gib * GIB:
        warnings.append(f"offload memory {r['offload_mem'] / GIB:.1f} GiB exceeds {off.capacity_gib:g} GiB")
    if r["offload_bw_need"] > off.bandwidth_gbps * 1e9 and (ex.weight_offload or ex.activation_offload):
        warnings.append(
            f"offload link needs {r['offload_bw_need'] / 1e9:.0f} GB/s, has {off.bandwidth_gbps:g}: "
            "transfers are exposed"
        )
    if r["bubble"] > 0.2 * r["step_time"]:
        warnings.append(f"pipeline bubble is {100 * r['bubble'] / r['step_time']:.0f}% of the step")
    ttt = None
    if problem.training.tokens:
        ttt = problem.training.tokens / r["tokens_per_s"]
    return Evaluation(problem, full_ex, r, bool(fits), ttt, warnings, plan_goodput(problem, full_ex, r))


def placement_warnings(problem: Problem, row: dict) -> list[str]:
    """Where the TP, CP or EP groups leave the fast tier: too large for its domain, or crossing domains
    because their consecutive ranks do not divide the job's GPUs in each (`Network.used`)."""
    nets = problem.system.networks
    fast = nets[0]
    held = min(fast.used, int(row["tp"] * row["cp"] * row["dp"] * row["pp"]))
    span = {"tp": row["tp"], "cp": row["tp"] * row["cp"], "ep": row["ep"] * row["etp"]}
    out = []
    for ax, what in (("tp", "TP traffic"), ("cp", "the CP exchange"), ("ep", "the MoE all-to-all")):
        if row[ax] <= 1 or row[f"tier_{ax}"] == 0:
            continue
        name, s = nets[row[f"tier_{ax}"]].name, int(span[ax])
        if s <= fast.size:
            why = (
                f"its {s} consecutive ranks do not divide the {held} GPUs the job uses in each "
                f"'{fast.name}' domain, so groups cross domains; a degree whose span divides {held} keeps "
                "each group in one"
            )
        else:
            why = f"the fast tier '{fast.name}' holds {fast.size}"
        out.append(f"{ax.upper()} group of {row[ax]} runs over '{name}' ({why}): {what} is slow")
    return out


def plan_goodput(problem: Problem, ex: Execution, r: dict):
    """Expected time and cost to train of a plan (`optimizer.model.goodput`), None without training.tokens;
    goodput inputs that cannot describe the run are bad input at their field."""
    from optimizer.model import goodput
    from optimizer.prepare.objective import gpus_used

    try:
        return goodput.of_problem(problem, gpus_used(ex), r["step_time"], goodput.busy_share(r))
    except goodput.GoodputInputError as e:
        raise problem_field_error(problem, e.field, str(e)) from None


def problem_field_error(problem: Problem, field_path: str, message: str):
    """A `ProblemError` at a field of the problem's file (its line when the problem was loaded from one)."""
    return sourced_field_error(problem.source_document(), field_path, message)


def sourced_field_error(doc, field_path: str, message: str):
    """A `ProblemError` at a field of a loaded document (`Sourced`: file and line; None: no file)."""
    from optimizer.errors import ProblemError

    if doc is None:
        return ProblemError("<problem>", None, field_path, message)
    file, line = doc.locate(tuple(field_path.split(".")))
    return ProblemError(file, line, field_path, message)


def as_json(ev: Evaluation) -> dict[str, Any]:
    from optimizer.report.text import evaluation_dict

    return evaluation_dict(ev)
