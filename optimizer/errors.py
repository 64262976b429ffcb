"""Errors that reach the user. None of them is shown with a traceback by the CLI."""

from __future__ import annotations

from enum import StrEnum


class ParaplanError(Exception):
    """Base class of every error the CLI reports in one line and a non-zero exit."""

    exit_code = 2


class ProblemError(ParaplanError):
    """Invalid input: names the file, the line and the field path.

    Rendered as ``problems/x.yaml:14: system.hbm_gib: must be > 0``.
    """

    exit_code = 2

    def __init__(self, path: str, line: int | None, field: str | None, message: str):
        self.path, self.line, self.field, self.message = path, line, field, message
        where = f"{path}:{line}" if line else f"{path}"
        what = f"{field}: {message}" if field else message
        super().__init__(f"{where}: {what}")

    def __reduce__(self):  # rebuilt from its parts when it crosses a process boundary (procure's workers)
        return (type(self), (self.path, self.line, self.field, self.message))


class ProblemErrors(ParaplanError):
    """Several `ProblemError`s found at once (all are printed)."""

    exit_code = 2

    def __init__(self, errors: list[ProblemError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class OutOfRange(ParaplanError):
    """Input within every field's bounds whose combination gives magnitudes the solver's 64-bit integers
    cannot hold (exit 2, bad input): the message names the quantity."""

    exit_code = 2


class Reason(StrEnum):
    """Why no plan was given, the same set from every solve path (CP-SAT, enumeration, check)."""

    RULES = "rules"  # no candidate satisfies the integer rules (optimizer.rules.layout)
    MEMORY = "memory"  # none fits in memory (HBM, offload memory)
    TARGET = "target"  # some fit, none meets the objective's target (step time, days, GPU-hours)
    TIME_LIMIT = "time_limit"  # the solver's time limit passed before any plan was found


class Infeasible(ParaplanError):
    """Nothing in the modelled space fits (exit 3), proven. `reason`: a `Reason` (rules, memory or target)."""

    exit_code = 3

    def __init__(self, msg: str, reason: Reason | str):
        super().__init__(msg)
        self.reason = Reason(reason)


class TimeLimit(ParaplanError):
    """The time limit passed before any plan was found (exit 4): not a proof that nothing fits."""

    exit_code = 4
    reason = Reason.TIME_LIMIT


class VerificationError(ParaplanError):
    """The solver and the analytical model disagree: a bug, reported loudly (exit 5)."""

    exit_code = 5
