"""Schema of a study file (`paraplan study`): a base problem and axes swept over field paths."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, model_validator

from optimizer.schema.common import Frozen, Int, PositiveFloat, PositiveInt


class StudyCommand(StrEnum):
    """What every point runs."""

    SOLVE = "solve"
    CHECK = "check"


class Mode(StrEnum):
    """How the axes combine: every combination (cross) or their values side by side (zip)."""

    CROSS = "cross"
    ZIP = "zip"


class Range(Frozen):
    """Values from `from` to `to` (inclusive) in steps of `step`."""

    from_: Int = Field(alias="from", description="First value.")
    to: Int = Field(description="Last value (included when on the grid).")
    step: PositiveInt = Field(1, description="Step between values.")

    @model_validator(mode="after")
    def _order(self):
        if self.to < self.from_:
            raise ValueError("to must be >= from")
        if (self.to - self.from_) // self.step >= 100_000:
            raise ValueError("more than 100,000 values on one axis")
        return self

    def values(self) -> list[int]:
        return list(range(self.from_, self.to + 1, self.step))


class Study(Frozen):
    """A sweep: `base` (a problem file, relative to the study file, or an inline problem mapping) with the
    field at each axis' path set to each of its values (`num_gpus`, `system.hbm_gib`,
    `system.offload.capacity_gib`, `training.global_batch`, `llm`, `search.tp`, ...)."""

    name: str | None = Field(None, description="Study name.")
    description: str | None = Field(None, description="Free text: the question, the paper it reproduces.")
    command: StudyCommand = Field(StudyCommand.SOLVE, description="solve | check, run at every point.")
    base: str | dict[str, Any] = Field(description="The base problem: a path or an inline mapping.")
    axes: dict[str, Range | list[Any]] = Field(
        description="Field path -> values (a list, or {from, to, step})."
    )
    mode: Mode = Field(Mode.CROSS, description="cross: every combination; zip: the i-th value of every axis.")
    time_limit_s: PositiveFloat = Field(60.0, le=86400, description="Solver time limit per point, s.")

    @model_validator(mode="after")
    def _axes(self):
        if not self.axes:
            raise ValueError("a study needs at least one axis")
        lens = {k: len(self.axis_values(k)) for k in self.axes}
        if any(n == 0 for n in lens.values()):
            raise ValueError("every axis needs at least one value")
        if self.mode == Mode.ZIP and len(set(lens.values())) > 1:
            raise ValueError(f"zip needs axes of one length (got {lens})")
        total = 1
        for n in lens.values():
            total *= n
        if self.mode == Mode.CROSS and total > 1_000_000:
            raise ValueError(f"{total:,} points (at most 1,000,000)")
        return self

    def axis_values(self, key: str) -> list[Any]:
        v = self.axes[key]
        return v.values() if isinstance(v, Range) else list(v)
