"""Schema of fleet planning (`paraplan fleet`): several training jobs, one catalog of node types, a horizon of
periods. Money in US dollars (`*_usd`), power in kilowatts (`*_kw`), time in days as named.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, PrivateAttr, field_validator, model_validator

from optimizer.schema.common import MAX_COUNT, Frozen, PositiveFloat, PositiveInt
from optimizer.schema.goodput import Goodput
from optimizer.schema.llm import LLM
from optimizer.schema.problem import Options, Search, Training
from optimizer.schema.procure import Catalog


class FleetGoal(StrEnum):
    """What `fleet` optimises."""

    COST = "cost"  # cheapest purchase that trains every job's tokens by its deadline
    TOKENS = "tokens"  # most weighted tokens trained within the budget by the end of the horizon


class FleetJob(Frozen):
    """One training job of the portfolio."""

    name: str = Field(description="Job identifier.")
    llm: LLM = Field(description="The model: a name in problems/llms/, or inline.")
    training: Training = Field(description="Batch, precision and `tokens` to train (required).")
    deadline_period: PositiveInt | None = Field(
        None,
        description="goal cost: the job's tokens must be trained "
        "by the end of this period (1-based); null = end of the horizon.",
    )
    weight: PositiveFloat = Field(1.0, description="goal tokens: value of one trained token of this job.")
    search: Search | None = Field(None, description="Restrictions of the knob space, as in `solve`.")

    @model_validator(mode="after")
    def _tokens(self) -> FleetJob:
        if not self.training.tokens:
            raise ValueError("a fleet job needs training.tokens")
        if self.training.phases:
            raise ValueError("training.phases: a fleet job trains one batch size (solve plans a schedule)")
        return self


class Fleet(Frozen):
    """Horizon, limits and objective of the portfolio."""

    goal: FleetGoal = Field(FleetGoal.COST, description="cost | tokens.")
    periods: PositiveInt = Field(
        le=1000,
        description="Number of planning periods (e.g. 4 quarters; at most 1,000: weekly over 19 years). The "
        "portfolio MILP has a binary per (job, type, size, period).",
    )
    period_days: PositiveFloat = Field(description="Length of one period, days (a quarter: 91.25).")
    budget_usd: PositiveFloat | None = Field(
        None,
        description="Most that may be spent on nodes over the "
        "horizon, USD (capex; required for goal tokens).",
    )
    power_kw: PositiveFloat | None = Field(
        None, description="Power cap of all nodes owned in any period, kW."
    )
    sizes_nodes: list[PositiveInt] = Field(
        min_length=1,
        description="The grid of job sizes, nodes: each job "
        "runs on one node type at one of these sizes in a period.",
    )

    @model_validator(mode="after")
    def _check(self) -> Fleet:
        if self.goal == FleetGoal.TOKENS and self.budget_usd is None:
            raise ValueError("goal tokens needs budget_usd")
        if len(set(self.sizes_nodes)) != len(self.sizes_nodes):
            raise ValueError("sizes_nodes must be distinct")
        return self


class FleetProblem(Frozen):
    """A fleet problem: which nodes to buy in which period and which job runs where and when."""

    name: str | None = Field(None, description="Problem name.")
    description: str | None = Field(None, description="Free text.")
    catalog: Catalog = Field(
        description="Node types on offer (capex price_usd + extra_usd, power_kw, "
        "max_nodes = availability in every period): a name in problems/catalogs/, or inline."
    )
    types: list[str] | None = Field(
        None, min_length=1, description="Node types of the catalog considered (null = all)."
    )
    jobs: list[FleetJob] = Field(min_length=1, description="The training jobs.")
    fleet: Fleet = Field(description="Horizon, budget, power cap and objective.")
    options: Options = Field(default_factory=Options, description="Memory headroom.")
    _source: Any = PrivateAttr(None)  # the loaded document (its `goodput` fields' lines for sub-problems)

    goodput: Goodput | None = Field(
        None,
        description="Failures, checkpoints, spares and energy (optimizer.schema.goodput): each (job, type, "
        "size)'s effective training share and the fleet's energy are reported with the cited defaults; when "
        "given, a job trains only its expected share of each period (the plans minimise the expected time).",
    )

    @field_validator("goodput")
    @classmethod
    def _one_spare_count(cls, g):
        if g is not None and isinstance(g.spare_nodes, list):
            raise ValueError("spare_nodes: a list of counts is procure's choice; fleet takes one count")
        return g

    @model_validator(mode="after")
    def _check(self) -> FleetProblem:
        names = [t.name for t in self.catalog.node_types]
        for t in self.types or []:
            if t not in names:
                raise ValueError(f"unknown node type {t!r} (catalog has {', '.join(names)})")
        for j in self.jobs:
            if j.deadline_period is not None and j.deadline_period > self.fleet.periods:
                raise ValueError(
                    f"job {j.name}: deadline_period {j.deadline_period} is after the horizon "
                    f"({self.fleet.periods} periods)"
                )
        for t in self.node_types:
            big = [s for s in self.fleet.sizes_nodes if s * t.gpus_per_node > MAX_COUNT]
            if big:  # a (job, type, size) sub-problem of more GPUs than a problem may have
                raise ValueError(
                    f"fleet.sizes_nodes: {big[0]:,} nodes of {t.name} are {big[0] * t.gpus_per_node:,} GPUs, "
                    f"more than {MAX_COUNT:,}"
                )
            if t.price_usd is None:
                raise ValueError(f"node type {t.name}: fleet needs price_usd")
            if self.fleet.power_kw is not None and t.power_kw is None:
                raise ValueError(f"node type {t.name}: a power cap needs power_kw")
        jn = [j.name for j in self.jobs]
        if len(set(jn)) != len(jn):
            raise ValueError("job names must be unique")
        return self

    @property
    def node_types(self):
        return [t for t in self.catalog.node_types if self.types is None or t.name in self.types]
