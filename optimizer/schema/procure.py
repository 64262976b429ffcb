"""Schemas of procurement: hardware catalogs (`problems/catalogs/`) and procurement problems
(`paraplan procure`).

Money is in US dollars (`*_usd`), power in kilowatts (`*_kw`), time in days or hours as named.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from optimizer.schema.common import Frozen, NonNegativeFloat, PositiveFloat, PositiveInt
from optimizer.schema.goodput import Goodput
from optimizer.schema.llm import LLM
from optimizer.schema.problem import Options, Search, Training
from optimizer.schema.stack import Stack
from optimizer.schema.system import Network, System


def whole_units(nodes_used, unit_nodes: int):
    """Nodes bought to hold `nodes_used` nodes when they are sold `unit_nodes` at a time (a rack): the next
    whole unit. Integers or numpy arrays."""
    return -(-nodes_used // unit_nodes) * unit_nodes


class NodeType(Frozen):
    """One kind of node that can be bought or rented: a system (GPUs, memories, networks) and its prices."""

    name: str = Field(description="Identifier of the node type, e.g. h100-80g-ddr512.")
    system: System = Field(
        description="The node: a name in problems/systems/, or inline (`base: NAME` plus "
        "overrides such as hbm_gib or offload)."
    )
    price_usd: NonNegativeFloat | None = Field(None, description="Capital cost of one node, USD.")
    extra_usd: NonNegativeFloat = Field(
        0.0, description="Extra capital cost per node (network share, rack, install), USD."
    )
    rent_usd_per_gpu_hour: PositiveFloat | None = Field(None, description="Rental price per GPU-hour, USD.")
    power_kw: PositiveFloat | None = Field(
        None, description="Power draw of one node under training load, kW."
    )
    max_nodes: PositiveInt | None = Field(
        None, description="Availability: the most nodes of this type on offer."
    )
    unit_nodes: PositiveInt = Field(
        1,
        description="Nodes sold only together, as one unit: a rack-scale system "
        "(GB200/GB300 NVL72: 18 compute trays of 4 GPUs, the node being the tray) is "
        "bought in whole racks. Prices, power and max_nodes stay per node; a purchase is "
        "a multiple of unit_nodes nodes, and a plan may leave GPUs of its last unit idle.",
    )

    @property
    def gpus_per_node(self) -> int:
        return self.system.gpus_per_node

    def bought(self, nodes_used: int) -> int:
        """Nodes bought for a plan that uses `nodes_used` nodes: whole units."""
        return whole_units(nodes_used, self.unit_nodes)

    @property
    def node_usd(self) -> float | None:
        """Capital cost of one node with its extras."""
        return None if self.price_usd is None else self.price_usd + self.extra_usd


class Catalog(Frozen):
    """Node types on offer, with their prices."""

    name: str = Field(description="Catalog identifier.")
    description: str | None = Field(None, description="Where the prices come from.")
    node_types: list[NodeType] = Field(min_length=1, description="The node types (variants expanded).")
    joining_network: Network | None = Field(
        None,
        description="Network that joins nodes of different types (heterogeneous mixes); null = the "
        "slower of the two types' outermost tiers.",
    )

    @model_validator(mode="after")
    def _unique(self) -> Catalog:
        names = [t.name for t in self.node_types]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"node type names must be unique: {dup}")
        return self


class Pricing(StrEnum):
    """How hardware is paid for."""

    CAPEX = "capex"  # nodes bought: nodes x (price_usd + extra_usd)
    RENTAL = "rental"  # GPUs rented for the training run: GPUs x hours to train x rent_usd_per_gpu_hour


class ProcureGoal(StrEnum):
    """What `procure` optimises."""

    THROUGHPUT = "throughput"  # maximum tokens/s within the budget
    TIME_TO_TRAIN = "time_to_train"  # minimum days to train training.tokens within the budget
    COST = "cost"  # minimum cost that trains training.tokens within deadline_days
    THROUGHPUT_PER_USD = (
        "throughput_per_usd"  # maximum tokens/s per dollar (capex) or per dollar-hour (rental)
    )


class Heterogeneous(StrEnum):
    """Which heterogeneous mixes (more than one node type in one job) are searched."""

    NONE = "none"
    DATA = "data"  # data-parallel replicas on different types, global batch split in proportion to speed
    PIPELINE = "pipeline"  # pipeline stages on different types, uneven layers per stage
    # (optimizer.drivers.pipeline_mix)
    ALL = "all"  # both families


class Procure(Frozen):
    """The purchase: budget, limits, objective."""

    goal: ProcureGoal = Field(
        ProcureGoal.THROUGHPUT, description="throughput | time_to_train | cost | throughput_per_usd."
    )
    pricing: Pricing = Field(Pricing.CAPEX, description="capex (buy nodes) or rental (pay GPU-hours).")
    budget_usd: PositiveFloat | None = Field(
        None,
        description="Most that may be spent, USD (capex: on nodes; "
        "rental: on the whole training run, which needs training.tokens).",
    )
    power_kw: PositiveFloat | None = Field(None, description="Power cap of the whole purchase, kW.")
    deadline_days: PositiveFloat | None = Field(
        None, description="goal cost: training.tokens must be trained within this many days."
    )
    max_types: PositiveInt = Field(1, description="At most this many distinct node types in the purchase.")
    heterogeneous: Heterogeneous = Field(
        Heterogeneous.NONE,
        description="Mixes searched when max_types >= 2: "
        "none, data (DP replicas on different types), pipeline (pipeline stages on different types, uneven "
        "layer counts) or all.",
    )
    max_nodes: PositiveInt = Field(
        4096,
        description="Upper bound on nodes of one type when nothing else "
        "bounds them (no budget, power cap or availability).",
    )
    calibrated_only: bool = Field(
        False,
        description="Exclude node types whose system is prior-only (efficiencies "
        "neither calibrated on published runs nor transferred from a same-die system).",
    )

    @model_validator(mode="after")
    def _check(self) -> Procure:
        if self.goal == ProcureGoal.COST and self.deadline_days is None:
            raise ValueError("goal cost needs deadline_days")
        if self.heterogeneous != Heterogeneous.NONE and self.max_types < 2:
            raise ValueError("heterogeneous mixes need max_types >= 2")
        return self


class ProcureProblem(Frozen):
    """A procurement problem: what to buy (or rent) to train `llm` with `training`, from `catalog`."""

    name: str | None = Field(None, description="Problem name.")
    description: str | None = Field(None, description="Free text.")
    llm: LLM = Field(description="The model: a name in problems/llms/, or inline.")
    catalog: Catalog = Field(description="Node types on offer: a name in problems/catalogs/, or inline.")
    training: Training = Field(description="Batch, precision, tokens to train.")
    procure: Procure = Field(default_factory=Procure, description="Budget, limits and objective.")
    search: Search | None = Field(None, description="Restrictions of the knob space, as in `solve`.")
    stack: Stack = Field(
        Stack.MEGATRON_CORE,
        description="Training framework (as in a solve problem): only the knobs it offers are searched.",
    )
    options: Options = Field(
        default_factory=Options, description="Memory headroom (idle GPUs and whole nodes are set by procure)."
    )
    _source: Any = PrivateAttr(None)  # the loaded document (its `goodput` fields' lines for sub-problems)

    goodput: Goodput | None = Field(
        None,
        description="Failures, checkpoints, spares and energy (optimizer.schema.goodput): every purchase's "
        "expected time and cost to train is reported with the cited defaults; when given, goal time_to_train "
        "ranks purchases and plans by the expected time to train.",
    )

    @model_validator(mode="after")
    def _check(self) -> ProcureProblem:
        pr = self.procure
        needs_tokens = pr.goal in (ProcureGoal.TIME_TO_TRAIN, ProcureGoal.COST) or (
            pr.pricing == Pricing.RENTAL and pr.budget_usd is not None
        )
        if self.training.phases:
            raise ValueError(
                "training.phases: procure plans one batch (solve plans each phase of a schedule)"
            )
        if needs_tokens and not self.training.tokens:
            raise ValueError(
                f"procure (goal {pr.goal.value}, pricing {pr.pricing.value}) needs training.tokens"
            )
        for t in self.catalog.node_types:
            if pr.pricing == Pricing.CAPEX and t.price_usd is None:
                raise ValueError(f"node type {t.name}: capex pricing needs price_usd")
            if pr.pricing == Pricing.RENTAL and t.rent_usd_per_gpu_hour is None:
                raise ValueError(f"node type {t.name}: rental pricing needs rent_usd_per_gpu_hour")
            if pr.power_kw is not None and t.power_kw is None:
                raise ValueError(f"node type {t.name}: a power cap needs power_kw")
        return self
