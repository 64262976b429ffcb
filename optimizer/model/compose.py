"""The training step composed from its factors: written once, for floats and for integers.

`optimizer.model.step.evaluate` calls these functions with float arrays (seconds, bytes); the CP-SAT tables
(`formulations.tables`, `formulations.pairs`) call the same functions with integer arrays (time in ns,
memory in KiB, counts exact), so the solver's objective is the model's composition by construction.

Factors, by what they depend on (B global batch, S layer slots = layers (+ 2 with the embedding/loss
split), dp, pp, vpp, mb the micro-batch; Ls = S/pp layers of the busiest stage; Narayanan et al. 2021):

    layout   A1 = B*S/(dp*pp)       sequences x layers of a stage per step   (n_mb * mb * Ls)
             (with interleaving and overlap_p2p_comm the steady-state p2p is only what exceeds a chunk's
             forward, Lc*fw: `p2p_steady`)
             A2 = B/dp              sequences per replica per step            (n_mb * mb)
             Ls = S/pp;  pm2 = 2*(pp-1)  p2p exchanges of pipeline fill and drain
    vpp      Lc = S/(pp*vpp)        layers per chunk
             Wm = Lc*(1+(vpp-1)*pp) the DP overlap window in chunk-layer backwards (Calculon's window)
             E  = 2*B*vpp/dp        steady-state p2p exchanges x mb (pp > 1)
             Bf = Lc*(pp-1)         the 1F1B bubble in layer times: (pp-1)/vpp * Ls
             inflv = Lc*(pp*(vpp+1)-1)  layers in flight, interleaved (Korthikanti et al. 2022, 4.2.3)
    mb       nmb = B/(dp*mb);  NL = nmb*Ls;  infl1 = Ls*min(nmb, pp)  layers in flight, 1F1B
    block    per-micro-batch terms of one layer (tau, its forward/backward parts, head, p2p, stored and
             working activations) from `optimizer.model.layer`, divided by mb where a factor carries mb.
"""

from __future__ import annotations

import numpy as np


def _div(a, b):
    """a / b: exact floor division on integers (the factors divide exactly on legal plans), else true."""
    a, b = np.asarray(a), np.asarray(b)
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return a // b
    return a / b


def split_slots(slots, pp, vpp, uneven):
    """Layer slots of a pipeline split as the busiest chunk sees them: `slots` (layers, plus the embedding
    and loss slots) where pp*vpp divides them; for an uneven split (`uneven`, pp > 1) padded to the busiest
    chunk's ceil(slots / (pp vpp)) times pp*vpp, so every per-stage factor is the busiest stage's. The
    solver's tables call it with vpp 1: their space interleaves an uneven split only where vpp divides
    ceil(slots / pp), which then pads the same."""
    slots, pp = np.asarray(slots), np.asarray(pp)
    n = pp * np.asarray(vpp)
    return np.where(np.asarray(uneven, dtype=bool) & (pp > 1), -(-slots // n) * n, slots)  # ceil, exact


def layout_units(layers, el, uneven, mtp):
    """Layer slots a pipeline split places: the layers, with `el` the embedding and the loss, and in a custom
    layout (`uneven`) each of the `mtp` MTP modules' blocks (Megatron-Core counts one only in a layout; in a
    split by layers it adds to the last stage); generic over scalars and arrays."""
    return layers + 2 * el + np.where(np.asarray(uneven, dtype=bool), mtp, 0)


def layout_slack(units, pp, vpp, keep):
    """Slots the last stage of a custom layout of `units` slots over pp x vpp chunks holds fewer: the
    padding of `split_slots`, pp ceil(units / (pp vpp)) vpp - units, as long as the stage keeps `keep` (its
    loss slot and MTP blocks); generic over scalars and arrays."""
    per_stage = -(-np.asarray(units) // (pp * np.asarray(vpp))) * vpp
    return np.maximum(np.minimum(pp * per_stage - units, per_stage - keep), 0)


def layout_factors(B, slots, dp, pp) -> dict:
    """A1, A2, Ls, pm2 (module docstring)."""
    return {"A1": _div(B * slots, dp * pp), "A2": _div(B, dp), "Ls": _div(slots, pp), "pm2": 2 * (pp - 1)}


def vpp_factors(B, slots, dp, pp, vpp) -> dict:
    """Lc, Wm, E, Bf, inflv (module docstring)."""
    lc = _div(slots, pp * vpp)
    return {
        "Lc": lc,
        "Wm": lc * (1 + (vpp - 1) * pp),
        "E": np.where(pp > 1, _div(2 * B * vpp, dp), 0),
        "Bf": lc * (pp - 1),
        "inflv": lc * (pp * (vpp + 1) - 1),
    }


def mb_factors(B, slots, dp, pp, mb) -> dict:
    """nmb, NL, infl1 (module docstring)."""
    nmb = _div(B, dp * mb)
    ls = _div(slots, pp)
    return {"nmb": nmb, "NL": nmb * ls, "infl1": ls * np.minimum(nmb, pp)}


def edge_extra(h_last, h_first, tau, pp, el, uneven, slack, mtp_block):
    """The edge stages' work per micro-batch beyond the busiest stage's layer slots, s: `h_last` (the LM head
    and loss, and each MTP module's embedding, projection, head and loss) and `h_first` (the embedding), with
    `tau` one layer's time. Without a pipeline the one stage runs both, and the MTP blocks (`mtp_block`,
    mtp x tau). With the embedding and the loss as layer slots (`el`) the edge trades a slot for its extra
    work and MTP blocks, max(max(h_last + mtp_block, h_first) - tau, 0). A custom layout (`uneven`) also
    places the MTP blocks, ceil(slots / pp) on the busiest stage, and its last stage holds `slack` fewer
    slots, the padding of the split (`layout_slack`), as Megatron-Bridge's DeepSeek-V3 layouts give the
    last chunk one layer, the MTP module and the loss ('Et*4|(t*4|)*14tmL'): max(h_last - (slack + el) tau,
    h_first - el tau, 0). Otherwise (a split by layers) the last stage adds its head and MTP blocks:
    max(h_last + mtp_block, h_first)."""
    return np.select(
        [pp <= 1, uneven > 0, el > 0],
        [
            h_last + mtp_block + h_first,
            np.maximum(np.maximum(h_last - (slack + el) * tau, h_first - el * tau), 0.0),
            np.maximum(np.maximum(h_last + mtp_block, h_first) - tau, 0.0),
        ],
        np.maximum(h_last + mtp_block, h_first),
    )


def edge_head(head, t_p2p, pp):
    """The LM head and loss (per micro-batch) that the edge stage adds to the steady state: with a pipeline
    its extra work hides one of the 2*vpp p2p exchanges per micro-batch (a middle stage waits on two
    neighbours per chunk, the edge stage on one): max(head - t_p2p, 0); without one, all of it."""
    return np.where(pp > 1, np.maximum(head - t_p2p, 0 * head), head)


def p2p_steady(t_p2p, window, overlap):
    """A steady-state pipeline exchange's time on the critical path: all of it, or with `overlap` (interleaved
    1F1B with Megatron-Core's overlap_p2p_comm: each send/receive is posted before a chunk's compute and
    waited on after it) what exceeds that compute, `window`: max(t_p2p - window, 0)."""
    return np.where(overlap, np.maximum(t_p2p - window, 0 * t_p2p), t_p2p)


def fsdp_traffic(AG, RS):
    """ZeRO-3 (FSDP) traffic per micro-batch: parameters gathered in forward and backward, gradients
    reduce-scattered: 2*AG + RS."""
    return 2 * AG + RS


PIPE = ("pipe_layers_s", "pipe_head_s", "bubble_s", "p2p_steady_s", "p2p_fill_s", "offload_exposed_s")
"""The parts of the pipeline's share of the step (`optimizer.model.terms.StepTerms` fields), in sum order."""


def pipeline_sum(parts) -> object:
    """The pipeline's share of the step: the sum of the `PIPE` parts of `parts` (a mapping; floats, arrays or
    solver expressions)."""
    return sum(parts[k] for k in PIPE)


def pipeline(A1, A2, Bf, E, pm2, tau_mb, head_mb, tau, p2p_mb, p2p, offx_mb, Zf=0, fill=0) -> dict:
    """The pipeline's share of the step on its busiest stage (keys: `PIPE` and their sum `pipeline_s`):

    pipe_layers_s = n_mb*Ls*tau           = A1 * tau/mb
    pipe_head_s   = n_mb*max(head - t_p2p, 0) with pp > 1 (the edge stage's LM head and loss hide one p2p
                    exchange per micro-batch), n_mb*head without a pipeline = A2 * head_mb
    bubble_s      = (pp-1)/vpp*Ls*tau     = Bf * tau, less Zf * fill: the zero-bubble schedule
                    (Zf = Bf, interleaved) fills it with each layer's weight-gradient GEMMs (fill = 2 T_W);
                    DualPipeV's (pp-1)*(T_F&B + T_B - 3 T_W) per chunk is Zf = Bf, fill = 3 T_W - T_B;
                    ZB-V's (pp-1)*(T_F + T_B - 2 T_W) is fill = 3 T_W (T_B, T_W: the whole backward, its
                    weight gradients)
    p2p_steady_s  = 2*n_mb*vpp*t_p2p      = E * t_p2p/mb;   p2p_fill_s = 2*(pp-1)*t_p2p
    offload_exposed_s = n_mb*Ls*(exposed weight/activation streaming per layer) = A1 * offx/mb"""
    out = dict(
        zip(
            PIPE,
            (A1 * tau_mb, A2 * head_mb, Bf * tau - Zf * fill, E * p2p_mb, pm2 * p2p, A1 * offx_mb),
            strict=True,
        )
    )
    out["pipeline_s"] = pipeline_sum(out)
    return out


def dp_links(AR, RS, AG, F, nmb, regather=False) -> dict:
    """DP traffic per ZeRO stage on its link: all-reduce (0); reduce-scatter + all-gather (1); a
    reduce-scatter per micro-batch + all-gather, the gather per micro-batch too when the stack `regather`s (a
    Python bool: the stack's, one for every row, so integer tables stay integers) (2); FSDP's gather in
    forward and backward and reduce-scatter per micro-batch, F = 2*AG + RS (3)."""
    return {0: AR, 1: RS + AG, 2: nmb * RS + (nmb if regather else 1) * AG, 3: nmb * F}


def dp_exposed(
    AR, RS, AG, F, ARb, RSb, AGb, Fb, ARv, RSv, t_cb, W, Lfw, nmb, NL, bwt, fbt, regather=False
) -> dict:
    """Exposed DP traffic per ZeRO stage with overlap: the gradient reduction hides behind the backward of
    the last micro-batch (and, interleaved, the other chunks' cool-down: the window W), the gather behind
    the first forward (Lfw), one bucket (a layer: the *b arguments) always exposed; ZeRO-2/3 per micro-batch
    (ZeRO-2's gather too, behind each micro-batch's forward, when the stack `regather`s).
    *v: traffic / vpp; t_cb: backward of a chunk; NL: layers x micro-batches; bwt, fbt: one layer's
    backward, forward + backward."""
    zero = 0 * AR
    e0 = np.maximum.reduce([zero + ARb, ARv - t_cb, AR - W])
    eg = np.maximum.reduce([zero + RSb, RSv - t_cb, RS - W])
    ea = np.maximum(zero + AGb, AG - Lfw)
    eg2 = np.maximum(nmb * RSb, nmb * RS - NL * bwt)
    ea2 = (nmb if regather else 1) * np.maximum(ea, 0)
    e3 = np.maximum(nmb * Fb, nmb * F - NL * fbt)
    return {
        0: np.maximum(e0, 0),
        1: np.maximum(eg, 0) + np.maximum(ea, 0),
        2: np.maximum(eg2, 0) + ea2,
        3: np.maximum(e3, 0),
    }


def v_schedule(is_v, pp, vpp, nmb):
    """Whether a candidate runs its V schedule (DualPipeV, ZB-V): the schedule named (`is_v`), a pipeline,
    two stages per rank and at least one micro-batch per stage (2*pp; PyTorch's ScheduleDualPipeV requires
    it, ScheduleZBVZeroBubble fills its pipeline from 2*pp-1); otherwise it runs as 1F1B."""
    return np.asarray(is_v, dtype=bool) & (pp > 1) & (vpp == 2) & (nmb >= 2 * pp)


def activations(
    inflv,
    infl1,
    NL,
    Ls,
    vpp,
    pp,
    gpipe,
    a_off,
    stored,
    working,
    emb_out,
    logits,
    a_part=0.0,
    vee=False,
    dual=False,
) -> dict:
    """Activation memory of the worst pipeline stage (Korthikanti et al. 2022): the first stage keeps the
    layers in flight (1F1B: Ls*min(n_mb, pp); interleaved: inflv; GPipe with pp > 1: every micro-batch) plus
    the working set of recompute and the embedding output; the last keeps Ls layers and the logits;
    activation offload keeps two layers in HBM and moves the rest (`offact`) to offload memory; a partial
    offload (`a_part`, the fraction of a stage's layers offloaded: Megatron-Core cpu_offloading_num_layers /
    layers) moves that fraction of every micro-batch's stored layers. A V schedule (`vee`, `v_schedule`):
    the first rank holds the last stage too, so the logits; ZB-V keeps 1F1B's pp*Ls layers (Qi et al. 2024,
    Sec. 6), DualPipeV (`dual`) 2*pp+1 chunks of Ls/2 layers (DeepSeek-V3 report, Table 2: PP+1 stages'
    activations on PP/2 ranks), = pp*Ls + Ls/2."""
    dual, vee = np.asarray(dual, dtype=bool), np.asarray(vee, dtype=bool)
    # without a pipeline every schedule runs each micro-batch's forward and backward in turn (gradient
    # accumulation): one micro-batch in flight, whatever the schedule is called
    gpipe = np.asarray(gpipe, dtype=bool) & (np.asarray(pp) > 1)
    layered = np.where(vpp > 1, inflv, infl1)
    v_held = Ls * pp + np.where(dual, _div(Ls, 2), 0 * Ls)
    inflight = np.minimum(np.where(gpipe, NL, np.where(vee, v_held, layered)), NL)
    keep = 1.0 - a_part
    held = np.where(a_off, 2, inflight * keep)
    first = held * stored + working + emb_out + np.where(vee, logits, 0 * logits)
    last = np.where(a_off, 2, Ls * keep) * stored + working + logits
    act = np.where(pp > 1, np.where(vee, first, np.maximum(first, last)), first + logits)
    offact = np.where(a_off, (inflight - 2) * stored, inflight * a_part * stored)
    # the loss's logits held by the worst stage (the last, the V-shape's first, or the only one)
    held_logits = np.where(pp > 1, np.where(vee | (last >= first), logits, 0 * logits), logits)
    return {"act": act, "offact": offact, "inflight": inflight, "logits": held_logits}
