"""Schemas of reliability, checkpoints and energy: what turns a step time into the expected wall time and
cost to train (`optimizer.model.goodput`).

Rates are interruptions per million GPU-hours (`*_per_mgpu_h`), times in seconds or hours as named,
bandwidths in GB/s (10^9 bytes per second), power in watts, money in US dollars. Every default is data in
`optimizer/model/goodput.yaml`, each value with its source.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from optimizer.schema.common import Frozen, Int, NonNegativeFloat, PositiveFloat

MAX_INTERVALS = 64  # checkpoint intervals a problem may offer the solver
MAX_SPARE_CHOICES = 16  # spare-node counts procure may choose from
SpareCount = Annotated[Int, Field(ge=0, le=100_000)]


class FailureCause(Frozen):
    """One cause of unplanned job interruptions, as a rate per GPU-hour of the job's GPUs."""

    name: str = Field(description="The cause, e.g. faulty GPU, HBM, network switch/cable, software bug.")
    per_mgpu_h: NonNegativeFloat = Field(
        description="Interruptions per million GPU-hours (Llama 3: 419 in 54 days on 16,384 GPUs = 19.7 in "
        "all)."
    )
    needs_node: bool = Field(
        True,
        description="The interruption takes a node out of service until it is repaired, so the job restarts "
        "on a spare (or waits); false: it restarts in place (software, a transient network error).",
    )
    source: str | None = Field(None, description="Where the rate comes from.")


class Reliability(Frozen):
    """How often a job is interrupted and how long each interruption costs besides the lost work."""

    causes: list[FailureCause] = Field(min_length=1, description="Unplanned interruptions by cause.")
    planned_per_mgpu_h: NonNegativeFloat = Field(
        0.0,
        description="Planned interruptions per million GPU-hours (maintenance, firmware, configuration; "
        "Llama 3: 47 in 54 days on 16,384 GPUs = 2.2): each costs a restart and a reload but no lost work "
        "(a checkpoint is taken first).",
    )
    detect_s: NonNegativeFloat = Field(
        description="From an unplanned failure to the job being stopped (watchdogs, health checks), s."
    )
    restart_s: NonNegativeFloat = Field(
        description="From the stop to training again, less the checkpoint reload: rescheduling, process "
        "start, communicator set-up, s."
    )
    repair_h: PositiveFloat = Field(
        description="Hours a failed node is out of service (a job without a spare waits for it), h."
    )
    source: str | None = Field(None, description="Where the values come from.")

    def per_mgpu_h(self) -> float:
        """All unplanned interruptions per million GPU-hours."""
        return sum(c.per_mgpu_h for c in self.causes)

    def node_share(self) -> float:
        """The share of unplanned interruptions that take a node out of service."""
        total = self.per_mgpu_h()
        return sum(c.per_mgpu_h for c in self.causes if c.needs_node) / total if total > 0 else 0.0


class Storage(Frozen):
    """Where checkpoints are written: per node and in aggregate (a parallel file system or object store)."""

    write_gbps_per_node: PositiveFloat = Field(description="Write bandwidth of one node to storage, GB/s.")
    read_gbps_per_node: PositiveFloat = Field(description="Read bandwidth of one node from storage, GB/s.")
    aggregate_write_gbps: PositiveFloat = Field(description="Sustained write bandwidth of the store, GB/s.")
    aggregate_read_gbps: PositiveFloat = Field(description="Sustained read bandwidth of the store, GB/s.")
    source: str | None = Field(None, description="Where the values come from.")


class Energy(Frozen):
    """The price of energy and the facility's overhead on it."""

    usd_per_kwh: NonNegativeFloat = Field(description="Price of electricity, USD per kWh.")
    pue: float = Field(
        ge=1.0, le=5.0, description="Power usage effectiveness: facility energy / IT energy (>= 1)."
    )
    source: str | None = Field(None, description="Where the values come from.")


class Goodput(Frozen):
    """Failures, checkpoints, spares and energy of a training run: every field has a cited default
    (`optimizer/model/goodput.yaml`), so `goodput: {}` (or nothing) plans with Meta's Llama 3 cluster."""

    reliability: Reliability | None = Field(
        None, description="Failure rates and restart costs; null = the system's, else the default."
    )
    storage: Storage | None = Field(None, description="Checkpoint storage; null = the default.")
    energy: Energy | None = Field(None, description="Electricity price and PUE; null = the default.")
    async_checkpoint: bool = Field(
        True,
        description="Checkpoints are written asynchronously (Megatron-Core async_save, PyTorch DCP "
        "async_save): the step waits only for the copy of each GPU's shard to host memory; the write to "
        "storage overlaps training, and a failure loses the work since the last checkpoint that finished.",
    )
    host_copy_gbps: PositiveFloat | None = Field(
        None,
        description="GPU-to-host copy bandwidth per GPU for the synchronous part of an asynchronous "
        "checkpoint, GB/s; null = the default.",
    )
    checkpoint_interval_s: PositiveFloat | list[PositiveFloat] | None = Field(
        None,
        description="Seconds of training between checkpoints: one value, or the values to choose from "
        "(the best for each plan is chosen with it); null = the default set (5 min to 4 h).",
    )
    spare_nodes: SpareCount | list[SpareCount] | None = Field(
        None,
        description="Nodes kept ready to replace failed ones; null = the job never waits for a replacement "
        "(a shared pool); with 0 a node failure waits for its repair. solve: beyond the plan's idle whole "
        "nodes. procure: bought with the purchase (their price within the budget), and a list offers counts "
        "to choose from with the purchase.",
    )
    idle_nodes_are_spares: bool = Field(
        True,
        description="With spare_nodes and options.allow_idle_gpus: a plan's idle whole nodes are spares too "
        "(procure's sub-problems, whose idle nodes are not bought, turn it off).",
    )
    rent_usd_per_gpu_hour: PositiveFloat | None = Field(
        None, description="Rental price per GPU-hour for the expected cost (solve), USD."
    )
    amortization_years: PositiveFloat | None = Field(
        None,
        le=30,
        description="Capex: the years over which a purchase is depreciated, so that a run is charged its "
        "share of the capital (null: the whole purchase).",
    )

    @model_validator(mode="after")
    def _intervals(self) -> Goodput:
        v = self.checkpoint_interval_s
        if isinstance(v, list):
            if not v:
                raise ValueError("checkpoint_interval_s: give at least one value")
            if len(v) > MAX_INTERVALS:
                raise ValueError(f"checkpoint_interval_s: at most {MAX_INTERVALS} values")
        s = self.spare_nodes
        if isinstance(s, list) and not 1 <= len(s) <= MAX_SPARE_CHOICES:
            raise ValueError(f"spare_nodes: give 1 to {MAX_SPARE_CHOICES} counts to choose from")
        return self

    def spare_count(self) -> int | None:
        """The one spare-node count (None: a pool); a list is procure's choice (`spare_choices`)."""
        if isinstance(self.spare_nodes, list):
            raise ValueError("spare_nodes: a list of counts is procure's choice; give one count")
        return self.spare_nodes

    def spare_choices(self) -> list[int | None]:
        """The spare-node counts to choose from (one value: itself)."""
        s = self.spare_nodes
        return sorted(set(s)) if isinstance(s, list) else [s]

    def intervals_s(self) -> list[float] | None:
        """The checkpoint intervals offered (s), or None: the default set."""
        v = self.checkpoint_interval_s
        return None if v is None else sorted(v) if isinstance(v, list) else [v]
