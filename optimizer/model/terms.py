"""The typed interface between the analytical model and the solvers: `StepTerms` and THE step-time sum.

`optimizer.model.step.evaluate` produces one `StepTerms` per evaluation (each field an array over the
candidates, or a float); the CP-SAT / Pyomo tables (`formulations.tables`) read its fields by attribute and
name their integer columns after them (a `_s` field held in TIME_UNIT, a `_bytes` field in KiB there).

The step time of the slowest pipeline stage (Narayanan et al. 2021, Sec. 2.2) is

    step = pipeline + dp_exposed + dp_slowdown + optimizer + fsdp_copies        (`compose_step`)

with pipeline the sum of `PIPE` (`optimizer.model.compose.pipeline`). The float model calls
`compose_step` on arrays; the integer formulations call it on their columns and solver variables, where
the DP variable already holds exposure plus overlap slowdown (Q*y_dp >= pu*link + (Q-pu)*exposed) and the
optimizer column already holds FSDP's copies, so those two parts are passed as 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Arr = np.ndarray | float


@dataclass(frozen=True)
class StepTerms:
    """The parts one step is composed of, per candidate. Seconds (`_s`), bytes (`_bytes`) or a plain
    fraction; "per micro-batch" terms are for one micro-batch of one layer or of the edge stage."""

    # ---- the step-time sum (`compose_step`), seconds per step
    pipe_layers_s: Arr  # n_mb * Ls * tau: every layer of the busiest stage for every micro-batch
    pipe_head_s: Arr  # n_mb * edge head: the LM head, loss and embedding not hidden behind a p2p exchange
    bubble_s: Arr  # pipeline fill and drain: (pp-1)/vpp * Ls * (tau, less bubble_fill_s with zero-bubble)
    p2p_steady_s: Arr  # steady-state p2p exchanges on the critical path: 2*n_mb*vpp*t_p2p
    p2p_fill_s: Arr  # fill and drain exchanges: 2*(pp-1)*t_p2p
    offload_exposed_s: Arr  # weight / activation offload streaming not hidden behind compute
    pipeline_s: Arr  # the sum of the six above (`compose.pipeline`)
    dp_exposed_s: Arr  # data-parallel gradient/parameter traffic on the critical path (after overlap)
    dp_slowdown_s: Arr  # compute lost to overlapped DP traffic (the DP tier's processor usage)
    optimizer_s: Arr  # the optimizer step (memory-bound Adam, or streamed over the offload link)
    fsdp_copies_s: Arr  # PyTorch FSDP's copies and casts around gradient reductions and parameter gathers
    # ---- data-parallel traffic of the busiest stage, link seconds per step (before overlap)
    dp_allreduce_s: Arr  # ring all-reduce of the gradients (ZeRO 0)
    dp_reduce_scatter_s: Arr  # reduce-scatter of the gradients (ZeRO >= 1; per micro-batch at ZeRO >= 2)
    dp_allgather_s: Arr  # all-gather of the weights (ZeRO >= 1; each micro-batch's forward and backward at 3)
    dp_bucket_fraction: Arr  # one layer's share of the stage's DP traffic, 1/Ls: the bucket always exposed
    fsdp_copy_allreduce_s: Arr  # PyTorch FSDP's passes around one gradient all-reduce (0 on other stacks)
    fsdp_copy_reduce_s: Arr  # ... around one gradient reduce-scatter
    fsdp_copy_gather_s: Arr  # ... around one parameter all-gather
    # ---- one layer / the edge stage, seconds per micro-batch
    layer_s: Arr  # tau: one layer's forward, backward, recompute and exposed TP/CP/EP traffic
    layer_fw_s: Arr  # its forward (compute and exposed traffic)
    layer_bw_s: Arr  # its backward (with recompute)
    bubble_fill_s: (
        Arr  # per layer: what the zero-bubble schedule fills the bubble with (2 T_W, backward GEMMs)
    )
    head_s: Arr  # the edge stages' work beyond the busiest stage's layers (`compose.edge_extra`)
    head_last_s: Arr  # the last stage's LM head and loss, and the MTP modules' but their blocks
    head_first_s: Arr  # the first stage's embedding
    p2p_s: Arr  # one pipeline exchange of an activation between neighbouring stages
    offload_layer_s: Arr  # a layer's offload streaming not hidden behind its forward and backward
    # ---- memory per GPU, bytes (worst stage)
    state_hbm_bytes: Arr  # weights + gradients + optimizer state in HBM
    state_offload_bytes: Arr  # weights, gradients and optimizer state moved to offload memory
    reserved_bytes: Arr  # the runtime's reserve (CUDA context, NCCL buffers)
    act_stored_bytes: Arr  # activations one layer keeps from forward to backward, per micro-batch
    act_working_bytes: Arr  # one layer's recompute working set
    emb_out_bytes: Arr  # the embedding output the first stage holds
    logits_bytes: Arr  # the loss's logits (and their fp32 softmax) the last stage holds, the MTP losses' too
    mtp_act_bytes: (
        Arr  # the MTP blocks' stored activations (one micro-batch), outside a custom layout's slots
    )


STEP_PARTS = ("pipeline_s", "dp_exposed_s", "dp_slowdown_s", "optimizer_s", "fsdp_copies_s")
"""The fields `compose_step` adds, in its order."""


def compose_step(pipeline, dp_exposed, dp_slowdown, optimizer, fsdp_copies):
    """THE step time: pipeline + exposed DP traffic + overlap slowdown + optimizer step + FSDP copies (module
    docstring). Works on floats, numpy arrays and solver expressions (only `+`)."""
    return pipeline + dp_exposed + dp_slowdown + optimizer + fsdp_copies


def step_of(t: StepTerms):
    """`compose_step` of a `StepTerms`, seconds."""
    return compose_step(*(getattr(t, n) for n in STEP_PARTS))
