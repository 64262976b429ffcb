"""Typed, frozen schemas of problem files (pydantic v2, unknown keys rejected)."""

from optimizer.schema.common import (
    AttentionKernel,
    Axis,
    CudaGraphs,
    GradAccumulation,
    MlpKind,
    MoeDispatcher,
    Precision,
    ProcessingMode,
    RankOrder,
    Recompute,
    Schedule,
    TpComm,
    TpOverlap,
)
from optimizer.schema.llm import LLM, MLA, MoE
from optimizer.schema.problem import Execution, Options, Problem, Range, Search, Training
from optimizer.schema.system import Calibration, Network, OffloadMemory, System

__all__ = [
    "AttentionKernel",
    "Axis",
    "CudaGraphs",
    "GradAccumulation",
    "MoeDispatcher",
    "MlpKind",
    "Precision",
    "ProcessingMode",
    "RankOrder",
    "Recompute",
    "Schedule",
    "TpComm",
    "TpOverlap",
    "LLM",
    "MLA",
    "MoE",
    "Execution",
    "Options",
    "Problem",
    "Range",
    "Search",
    "Training",
    "Calibration",
    "Network",
    "OffloadMemory",
    "System",
]
