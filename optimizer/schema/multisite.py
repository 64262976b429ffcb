"""Schema of procurement across sites (`paraplan procure` on a file with `sites`): power-capped sites, the
WAN links between them, and how data parallelism is synchronised over those links.

Power in megawatts (`*_mw`) at the facility meter (IT power x PUE), bandwidth in gigabits per second
(`*_gbps`, one direction), latency in milliseconds, distance in kilometres, money in US dollars. The
defaults that are not the user's to know (fibre latency per km, DiLoCo's sample efficiency) are data in
`optimizer/model/wan.yaml`, each with its source.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, PrivateAttr, model_validator

from optimizer.schema.common import Float, Frozen, NonNegativeFloat, PositiveFloat, PositiveInt
from optimizer.schema.goodput import Goodput
from optimizer.schema.llm import LLM
from optimizer.schema.problem import Options, Search, Training
from optimizer.schema.procure import Catalog
from optimizer.schema.stack import Stack

MAX_SITES = 24  # sites one problem may offer (the ring of sites is searched exactly)
MAX_INNER_STEPS_CHOICES = 16


class Site(Frozen):
    """One datacenter: its power, the node types it can host and what its energy costs."""

    name: str = Field(description="Identifier of the site, e.g. texas-1.")
    power_mw: PositiveFloat = Field(
        description="Facility power available to the training job, MW: nodes x node power x pue must fit."
    )
    pue: float = Field(
        1.1, ge=1.0, le=5.0, description="Power usage effectiveness of the site (facility / IT power)."
    )
    energy_usd_per_kwh: NonNegativeFloat = Field(
        0.0835, description="Price of the site's electricity, USD per kWh (default: US industrial, EIA 2024)."
    )
    node_types: dict[str, PositiveInt | None] = Field(
        min_length=1,
        description="Catalog node types the site can host, each with the most nodes on offer there (null: "
        "the catalog's max_nodes, else only the power cap bounds it).",
    )


class LinkOption(Frozen):
    """One way to connect two sites: a leased wave, a dark-fibre build, a public-internet path."""

    name: str | None = Field(None, description="Label of the option, e.g. 400G wave.")
    bandwidth_gbps: Float = Field(
        ge=0.001,
        le=1.0e9,
        description="Bandwidth the training job gets between the two sites, Gb/s in each direction "
        "(0.001-10^9).",
    )
    latency_ms: NonNegativeFloat | None = Field(
        None,
        description="One-way latency, ms; null: the link's distance_km at the speed of light in fibre "
        "(optimizer/model/wan.yaml).",
    )
    price_usd: NonNegativeFloat = Field(
        0.0, description="What the link costs for the training run (lease or build), USD."
    )


class Link(Frozen):
    """The options for connecting one pair of sites (a pair without a link cannot be adjacent in the ring)."""

    sites: tuple[str, str] = Field(description="The two sites' names.")
    distance_km: PositiveFloat | None = Field(
        None, description="Fibre route length, km (gives the latency of options that state none)."
    )
    options: list[LinkOption] = Field(min_length=1, description="The ways to connect them; one is chosen.")

    @model_validator(mode="after")
    def _check(self) -> Link:
        if self.sites[0] == self.sites[1]:
            raise ValueError("a link joins two different sites")
        if self.distance_km is None and any(o.latency_ms is None for o in self.options):
            raise ValueError("give latency_ms for every option, or the link's distance_km")
        return self


class Scheme(StrEnum):
    """How data-parallel replicas at different sites stay in step."""

    SYNC = "sync"  # every step's gradients all-reduced over the WAN (hierarchical: inside sites, then across)
    DILOCO = "diloco"  # H local steps per site, then an all-reduce of the outer pseudo-gradient (DiLoCo)
    PIPELINE = "pipeline"  # pipeline stages split over the sites in a chain: only activations cross the WAN


class Sync(Frozen):
    """The synchronisation schemes searched, and what each costs and needs."""

    schemes: list[Scheme] = Field(
        default_factory=lambda: [Scheme.SYNC, Scheme.DILOCO],
        min_length=1,
        description="Schemes searched: sync (per-step all-reduce over the WAN), diloco (DiLoCo, "
        "Douillard et al. 2023: H inner steps, then an outer all-reduce) and/or pipeline (pipeline stages "
        "split over the sites in a chain: activations cross the WAN, gradients stay in each site).",
    )
    inner_steps: list[PositiveInt] = Field(
        default_factory=lambda: [100],
        min_length=1,
        max_length=MAX_INNER_STEPS_CHOICES,
        description="DiLoCo: the inner-step counts H offered (INTELLECT-1 ran H = 100).",
    )
    outer_bytes_per_param: float = Field(
        1.0,
        description="DiLoCo: bytes per parameter of the outer all-reduce: 4 fp32, 2 bf16, 1 int8 "
        "(INTELLECT-1), 0.5 int4.",
    )
    overlap: bool = Field(
        False,
        description="DiLoCo: the outer all-reduce runs under the next H inner steps (Streaming DiLoCo's "
        "overlapped outer step); false: training waits for it (INTELLECT-1).",
    )
    gradient_bytes_per_param: float = Field(
        2.0, description="sync: bytes per parameter of the gradient all-reduce across sites (2: bf16)."
    )
    bidirectional_ring: bool = Field(
        True,
        description="The all-reduce across sites runs two rings in opposite directions, each on half the "
        "data, so both directions of every link carry traffic (Epoch AI's assumption).",
    )
    link_efficiency: float = Field(
        1.0, gt=0.0, le=1.0, description="Share of a link's bandwidth the all-reduce achieves."
    )
    tokens_multiplier: dict[PositiveInt, Annotated[Float, Field(ge=1.0, le=1000.0)]] | None = Field(
        None,
        description="DiLoCo: tokens to train relative to synchronous DP (1-1000), per number of sites "
        "(replicas); a count not given, and null, take the DiLoCo scaling law (Charles et al. 2025) through "
        "Chinchilla's data term, floored at 1 (optimizer/model/wan.yaml).",
    )
    min_sites: PositiveInt = Field(1, description="Use at least this many sites.")
    max_sites: PositiveInt | None = Field(None, description="Use at most this many sites (null: all).")
    site_counts: list[PositiveInt] | None = Field(
        None,
        max_length=MAX_SITES,
        description="Numbers of sites searched (null: every count from min_sites to max_sites); each count "
        "solves the sites' plans for its share of the batch once.",
    )
    batch_units: PositiveInt | None = Field(
        None,
        le=64,
        description="null: every site used trains an equal share of the global batch. A number U: the batch "
        "is split in U equal units and each site used trains a whole number of them (at least one), chosen "
        "with everything else, so faster sites take more; U must divide the global batch. Each share is a "
        "site plan solved (U - k + 1 shares per node type with k sites).",
    )

    @model_validator(mode="after")
    def _check(self) -> Sync:
        if self.outer_bytes_per_param not in (0.5, 1.0, 2.0, 4.0):
            raise ValueError("outer_bytes_per_param must be 0.5, 1, 2 or 4")
        if self.gradient_bytes_per_param not in (1.0, 2.0, 4.0):
            raise ValueError("gradient_bytes_per_param must be 1, 2 or 4")
        if self.max_sites is not None and self.max_sites < self.min_sites:
            raise ValueError("max_sites must be >= min_sites")
        if self.site_counts is not None and any(
            k < self.min_sites or (self.max_sites is not None and k > self.max_sites)
            for k in self.site_counts
        ):
            raise ValueError("site_counts must lie within min_sites..max_sites")
        if len(set(self.schemes)) != len(self.schemes):
            raise ValueError("schemes: each at most once")
        return self


class SitesGoal(StrEnum):
    TIME_TO_TRAIN = "time_to_train"  # fewest days to train training.tokens within the budget
    COST = "cost"  # cheapest nodes and links that train training.tokens within deadline_days


class SitesProcure(Frozen):
    """What the multi-site purchase optimises (nodes are bought: price_usd + extra_usd per node)."""

    goal: SitesGoal = Field(SitesGoal.TIME_TO_TRAIN, description="time_to_train | cost.")
    budget_usd: PositiveFloat | None = Field(None, description="Most that nodes and links may cost, USD.")
    deadline_days: PositiveFloat | None = Field(None, description="goal cost: train within this many days.")

    @model_validator(mode="after")
    def _check(self) -> SitesProcure:
        if self.goal == SitesGoal.COST and self.deadline_days is None:
            raise ValueError("goal cost needs deadline_days")
        return self


class MultisiteProblem(Frozen):
    """Train `llm` on nodes bought at one or several power-capped sites joined by WAN links."""

    name: str | None = Field(None, description="Problem name.")
    description: str | None = Field(None, description="Free text.")
    llm: LLM = Field(description="The model: a name in problems/llms/, or inline.")
    catalog: Catalog = Field(description="Node types and prices: a name in problems/catalogs/, or inline.")
    training: Training = Field(description="Batch (split evenly over the sites used), precision, tokens.")
    stack: Stack = Field(Stack.MEGATRON_CORE, description="Training framework inside each site.")
    search: Search | None = Field(None, description="Restrictions of each site's knob space, as in solve.")
    options: Options = Field(default_factory=Options, description="Memory headroom.")
    sites: list[Site] = Field(min_length=1, max_length=MAX_SITES, description="The candidate sites.")
    links: list[Link] = Field(default_factory=list, description="WAN link options between pairs of sites.")
    sync: Sync = Field(default_factory=Sync, description="Synchronisation schemes across sites.")
    procure: SitesProcure = Field(default_factory=SitesProcure, description="Goal, budget, deadline.")
    goodput: Goodput | None = Field(
        None,
        description="Failures, checkpoints and energy (optimizer.schema.goodput): every configuration's "
        "expected days are reported with the cited defaults; when given, goal time_to_train ranks the "
        "configurations by them (the deadline of goal cost still holds without failures); spare_nodes: "
        "one count.",
    )
    _source: Any = PrivateAttr(None)

    @model_validator(mode="after")
    def _check(self) -> MultisiteProblem:
        if self.training.phases:
            raise ValueError("training.phases: a multi-site procurement plans one batch")
        if not self.training.tokens:
            raise ValueError("training.tokens is needed: sites are chosen by the time or cost to train")
        if self.sync.min_sites > len(self.sites):
            raise ValueError(f"sync.min_sites {self.sync.min_sites} > the {len(self.sites)} sites")
        U = self.sync.batch_units
        if U is not None and self.training.global_batch % U:
            raise ValueError(
                f"sync.batch_units {U} must divide the global batch {self.training.global_batch}"
            )
        if U is not None and U < self.sync.min_sites:
            raise ValueError(
                f"sync.batch_units {U} < sync.min_sites {self.sync.min_sites}: a site needs a unit"
            )
        if any(k > len(self.sites) for k in self.sync.site_counts or []):
            raise ValueError(f"sync.site_counts: more than the {len(self.sites)} sites")
        if self.goodput is not None and isinstance(self.goodput.spare_nodes, list):
            raise ValueError("goodput.spare_nodes: a list of counts is chosen by single-site procure only")
        return self


def reference_errors(mp: MultisiteProblem) -> list[tuple[str, str]]:
    """(field path, message) for every name that refers to nothing: a site's node type not in the catalog
    (or without a price or a power figure), a link's unknown site, two links for one pair, a repeated site
    name."""
    types = {t.name: t for t in mp.catalog.node_types}
    names = [s.name for s in mp.sites]
    errs = [
        (f"sites.{i}.name", f"site name '{s.name}' is used twice")
        for i, s in enumerate(mp.sites)
        if names.index(s.name) != i
    ]
    for i, s in enumerate(mp.sites):
        for n in s.node_types:
            t = types.get(n)
            if t is None:
                errs.append((f"sites.{i}.node_types.{n}", f"'{n}' is not a node type of {mp.catalog.name}"))
            elif t.price_usd is None:
                errs.append((f"sites.{i}.node_types.{n}", f"node type {n} has no price_usd to buy it at"))
            elif t.power_kw is None and t.system.node_power_w is None:
                errs.append(
                    (
                        f"sites.{i}.node_types.{n}",
                        f"node type {n} has no power_kw (nor its system a node_power_w)",
                    )
                )
    pairs: set[frozenset] = set()
    for i, ln in enumerate(mp.links):
        for j, x in enumerate(ln.sites):
            if x not in names:
                errs.append((f"links.{i}.sites.{j}", f"unknown site '{x}' (sites: {', '.join(names)})"))
        key = frozenset(ln.sites)
        if key in pairs:
            errs.append(
                (f"links.{i}.sites", f"a second link between {sorted(key)}: give one with several options")
            )
        pairs.add(key)
    return errs
