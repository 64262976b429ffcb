"""The analytical model of one LLM training step: the single source of truth for time and memory.

Written once in numpy, it evaluates one configuration or arrays of candidate configurations at once
(every knob may be an array; results broadcast). Modules:

- `hardware`: op time on one GPU (roofline of matrix/vector peak and HBM bandwidth, each with an
  efficiency table by op size) and collective time on a network tier (alpha-beta ring model);
- `layer`: one transformer block, op by op, forward / backward / recompute, and its TP/CP traffic;
- `memory`: bytes per GPU by tier (weights, gradients, optimizer, activations after Korthikanti 2022);
- `step`: pipeline schedule, bubble, data-parallel traffic and overlap, optimizer, offload: the step time;
- `terms`: `StepTerms`, the typed parts of a step that the formulations read (seconds and bytes), and
  `compose_step`, the one step-time sum over them;
- `fitted`: the model-wide constants fitted on published runs (`fitted.yaml`).
"""

from optimizer.model.knobs import Knobs
from optimizer.model.step import StepResult, evaluate
from optimizer.model.terms import StepTerms, compose_step

__all__ = ["Knobs", "StepResult", "StepTerms", "compose_step", "evaluate"]
