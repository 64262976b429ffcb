"""`optimizer.model.compose`: the step's composition, one function for floats (the model) and integers (the
CP-SAT tables), checked on hand-worked factors and for the same answer in both number types."""

from __future__ import annotations

import numpy as np

from optimizer.model.compose import (
    activations,
    dp_exposed,
    dp_links,
    edge_head,
    layout_factors,
    mb_factors,
    pipeline,
    vpp_factors,
)


def test_factors_worked_by_hand():
    """B = 8 sequences, 12 layer slots, dp 2, pp 2, vpp 3, micro-batch 1."""
    B, S, dp, pp, v, mb = 8, 12, 2, 2, 3, 1
    assert layout_factors(B, S, dp, pp) == {"A1": 24, "A2": 4, "Ls": 6, "pm2": 2}  # 4 mb x 6 layers
    f = vpp_factors(B, S, dp, pp, v)
    # chunks of 2 layers; window 2*(1 + 2*2) = 10; 2*4*3 = 24 exchanges; bubble 2*(2-1) = 2 layer times;
    # in flight: 6*(2*(1+1/3) - 1/3) = 14 layers
    assert {k: int(x) for k, x in f.items()} == {"Lc": 2, "Wm": 10, "E": 24, "Bf": 2, "inflv": 14}
    assert {k: int(x) for k, x in mb_factors(B, S, dp, pp, mb).items()} == {"nmb": 4, "NL": 24, "infl1": 12}


def test_same_answer_on_floats_and_integers():
    rng = np.random.default_rng(0)
    ints = {
        k: rng.integers(1, 10**6, size=50)
        for k in (
            "tau_mb",
            "head_mb",
            "tau",
            "p2p_mb",
            "p2p",
            "offx_mb",
            "AR",
            "RS",
            "AG",
            "t_cb",
            "W",
            "Lfw",
            "bwt",
        )
    }
    fl = {k: v.astype(float) for k, v in ints.items()}
    for regather in (False, True):  # ZeRO-2's gather once a step, or per micro-batch (PyTorch FSDP stacks)
        for d in (ints, fl):
            d["pipe"] = pipeline(
                24, 4, 2, 24, 2, d["tau_mb"], d["head_mb"], d["tau"], d["p2p_mb"], d["p2p"], d["offx_mb"]
            )["pipeline_s"]
            d["links"] = dp_links(d["AR"], d["RS"], d["AG"], 2 * d["AG"] + d["RS"], 4, regather)
            d["exp"] = dp_exposed(
                d["AR"],
                d["RS"],
                d["AG"],
                2 * d["AG"] + d["RS"],
                d["AR"] // 6,
                d["RS"] // 6,
                d["AG"] // 6,
                (2 * d["AG"] + d["RS"]) // 6,
                d["AR"] // 3,
                d["RS"] // 3,
                d["t_cb"],
                d["W"],
                d["Lfw"],
                4,
                24,
                d["bwt"],
                2 * d["bwt"],
                regather,
            )
        assert ints["pipe"].dtype == np.int64 and np.array_equal(ints["pipe"], fl["pipe"])
        for z in range(4):
            assert ints["links"][z].dtype == np.int64 and np.array_equal(ints["links"][z], fl["links"][z])
            assert ints["exp"][z].dtype == np.int64 and np.array_equal(ints["exp"][z], fl["exp"][z])
            assert np.all(ints["exp"][z] >= 0) and np.all(ints["exp"][z] <= ints["links"][z])


def test_edge_head_hides_one_exchange():
    assert edge_head(5.0, 2.0, 4) == 3.0 and edge_head(1.0, 2.0, 4) == 0.0 and edge_head(5.0, 2.0, 1) == 5.0


def test_activations_gpipe_interleaved_offload():
    # 6 layers per stage, 4 micro-batches (24 layer-micro-batches), pp 2; interleaved: 14 layers in flight
    kw = dict(inflv=14, infl1=12, NL=24, Ls=6, pp=2, stored=10, working=3, emb_out=1, logits=7)
    assert activations(vpp=1, gpipe=False, a_off=False, **kw)["act"] == max(12 * 10 + 3 + 1, 6 * 10 + 3 + 7)
    assert activations(vpp=3, gpipe=False, a_off=False, **kw)["inflight"] == 14
    assert activations(vpp=1, gpipe=True, a_off=False, **kw)["inflight"] == 24
    off = activations(vpp=1, gpipe=False, a_off=True, **kw)
    assert off["act"] == max(2 * 10 + 3 + 1, 2 * 10 + 3 + 7) and off["offact"] == (12 - 2) * 10


def test_edge_extra_by_split():
    """The edge stages' work beyond the busiest stage's slots (`compose.edge_extra`), by hand: h_last 3,
    h_first 1, tau 1, one MTP block of 1."""
    from optimizer.model.compose import edge_extra

    def ex(pp, el, un, slack):
        return float(edge_extra(3.0, 1.0, 1.0, pp, el, un, slack, 1.0))

    assert ex(1, 0, 0, 0) == 3 + 1 + 1  # one stage runs everything
    assert ex(2, 0, 0, 0) == 3 + 1  # split by layers: the head and the MTP block on the last stage
    assert ex(2, 1, 0, 0) == 3 + 1 - 1  # the loss's slot takes a layer's time off
    assert ex(2, 0, 1, 0) == 3  # a custom layout with no padding: its block is in the stage
    assert ex(2, 0, 1, 2) == 1  # two blocks fewer on the last stage: the first's embedding binds
    assert ex(2, 0, 1, 5) == 1  # never below the first stage's


def test_uneven_pipeline_is_timed_by_its_busiest_stage(tmp_path):
    """pp_uneven (a custom layout, e.g. DeepSeek-V3's 61 layers over 16 chunks): the step is that of the even
    split whose every stage holds the busiest stage's ceil(L / pp) layers, less the padding the last stage
    leaves out; without it the split is an error."""
    import pytest

    from optimizer.drivers.evaluate import evaluate_execution
    from optimizer.io.loader import load_problem
    from optimizer.rules.cross_field import execution_errors
    from optimizer.schema import Execution

    def problem(layers: int):
        path = tmp_path / f"p{layers}.yaml"
        path.write_text(
            f"llm: {{base: gpt3-175b, layers: {layers}}}\nsystem: h100-sxm-80gb\nnum_gpus: 320\n"
            "training: {global_batch: 320}\noptions: {memory_headroom_gib: 0}\n"
        )
        return load_problem(path)

    ex = dict(tp=8, pp=5, micro_batch=1, recompute="full", sequence_parallel=True, zero=1)
    p96, p100 = problem(96), problem(100)
    assert any(f == "execution.pp" for f, _ in execution_errors(p96, Execution(**ex)))
    assert not execution_errors(p96, Execution(**ex, pp_uneven=True))
    uneven = evaluate_execution(p96, Execution(**ex, pp_uneven=True)).result
    even = evaluate_execution(p100, Execution(**ex)).result
    # every stage's layers as the even split's busiest, ceil(96 / 5) = 20, but the last stage holds the
    # padding's 4 fewer: its LM head and loss run in their place
    for part in ("fw", "bw", "recompute", "bubble"):
        assert uneven[part] == pytest.approx(even[part], rel=1e-12)
    # the busiest stage's weights (DP traffic, memory): the first's now, the last's (4 layers fewer) was
    # larger by the final norm
    for part in ("dp_exposed", "hbm"):
        assert uneven[part] == pytest.approx(even[part], rel=1e-4)
    assert uneven["head"] < even["head"] and uneven["step_time"] < even["step_time"]
    # on a split that divides, pp_uneven changes nothing
    ex8 = dict(ex, pp=8)
    a = evaluate_execution(p96, Execution(**ex8, pp_uneven=True)).result["step_time"]
    assert a == evaluate_execution(p96, Execution(**ex8)).result["step_time"]
