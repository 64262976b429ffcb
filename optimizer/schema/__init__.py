"""Typed, frozen schemas of problem files (pydantic v2, unknown keys rejected)."""

from .common import (AttentionKernel, CudaGraphs, EpDispatcher, Axis, MlpKind, Precision, ProcessingMode, Recompute, Schedule, TpComm,
                     TpOverlap)
from .llm import LLM, MLA, MoE
from .problem import Execution, Options, Problem, Range, Search, Training
from .system import Calibration, Network, OffloadMemory, System

__all__ = [
    "AttentionKernel", "Axis", "CudaGraphs", "EpDispatcher", "MlpKind", "Precision", "ProcessingMode", "Recompute", "Schedule", "TpComm",
    "TpOverlap", "LLM", "MLA", "MoE", "Execution", "Options", "Problem", "Range", "Search", "Training", "Calibration", "Network",
    "OffloadMemory", "System",
]
