"""`llm:` from a Hugging Face config.json (optimizer/io/hf_config.py): the shipped configs of five published
models map to the library's YAML of the same model (every shape field and the parameter counts) or to the
published total, and bad configs are file:line:field errors."""

from __future__ import annotations

import pytest
from helpers import ROOT, library_llm

from optimizer.cli import main
from optimizer.io.loader import load_problem
from optimizer.model.params import count

HF = ROOT / "problems" / "hf"


def problem(tmp_path, model: str, seq: int | None = None):
    path = tmp_path / "p.yaml"
    tr = f"{{global_batch: 64, seq_len: {seq}}}" if seq else "{global_batch: 64}"
    path.write_text(
        f"llm: {HF / model / 'config.json'}\nsystem: h100-sxm-80gb\nnum_gpus: 64\ntraining: {tr}\n"
    )
    return load_problem(path)


@pytest.mark.parametrize(
    "model, library, seq",
    [
        ("llama-3.1-8b", "llama3.1-8b", 8192),
        ("mixtral-8x7b", "mixtral-8x7b", 32768),
        ("qwen3-235b-a22b", "qwen3-235b-a22b", 32768),
        ("deepseek-v3", "deepseek-v3", 4096),
    ],
)
def test_config_maps_to_the_library_model(tmp_path, model, library, seq):
    got = problem(tmp_path, model, seq).llm
    want = library_llm(library)
    for field in (
        "hidden",
        "layers",
        "heads",
        "kv",
        "dhead",
        "vocab",
        "mlp",
        "tied_embeddings",
        "bias",
        "moe",
        "mla",
        "mtp_layers",
    ):
        assert getattr(got, field) == getattr(want, field), field
    assert count(got).total == count(want).total and count(got).active == count(want).active
    if got.rope is not None:  # the shipped configs state the base (Llama's without its rope_scaling block)
        assert got.rope.theta == want.rope.theta
    if want.moe is None or want.moe.moe_layers is not None:
        assert got.ffn == want.ffn


def test_gpt_neox_20b_matches_the_published_total(tmp_path):
    """Black et al. 2022 (GPT-NeoX-20B): 20,554,567,680 parameters (biases, untied head, LayerNorms)."""
    llm = problem(tmp_path, "gpt-neox-20b").llm
    assert llm.mlp.value == "gelu" and llm.bias and llm.seq_len == 2048  # max_position_embeddings
    assert count(llm).total == pytest.approx(20_554_567_680, rel=2e-3)


def test_bad_configs_are_located_errors(tmp_path, capsys):
    cfg = tmp_path / "m" / "config.json"
    cfg.parent.mkdir()
    for text, words in (
        ('{"model_type": "t5"}', "not supported"),
        ('{"model_type": "llama"}', "lacks"),
        ("not json", "not a JSON config"),
        ("[1, 2]", "JSON object"),
    ):
        cfg.write_text(text)
        path = tmp_path / "p.yaml"
        path.write_text(f"system: h100-sxm-80gb\nllm: {cfg}\nnum_gpus: 8\ntraining: {{global_batch: 8}}\n")
        assert main(["solve", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{path}:2: llm: " in err and words in err and "Traceback" not in err


def test_solve_with_a_config(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(
        f"llm: {HF / 'llama-3.1-8b' / 'config.json'}\nsystem: h100-sxm-80gb\nnum_gpus: 8\n"
        "training: {global_batch: 16, seq_len: 8192}\n"
    )
    assert main(["solve", str(path)]) == 0
    assert "optimal" in capsys.readouterr().out


@pytest.mark.parametrize(
    "scaling, want",
    [
        ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, ("llama3", 8.0)),
        ({"type": "yarn", "factor": 40}, ("yarn", 40.0)),
        ({"rope_type": "dynamic", "factor": 2.0}, (None, None)),  # a kind paraplan does not name: base only
        (None, (None, None)),
    ],
)
def test_rope_base_and_scaling_are_read(tmp_path, scaling, want):
    import json

    cfg = json.loads((HF / "llama-3.1-8b" / "config.json").read_text())
    cfg["rope_scaling"] = scaling
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    path = tmp_path / "p.yaml"
    path.write_text(
        f"llm: {d / 'config.json'}\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {{global_batch: 8}}\n"
    )
    rope = load_problem(path).llm.rope
    assert rope.theta == 500000.0
    assert (rope.scaling and rope.scaling.value, rope.factor) == want


def test_bad_rope_theta_is_a_located_error(tmp_path, capsys):
    import json

    cfg = json.loads((HF / "llama-3.1-8b" / "config.json").read_text())
    cfg["rope_theta"] = "big"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    path = tmp_path / "p.yaml"
    path.write_text("llm: config.json\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {global_batch: 8}\n")
    assert main(["solve", str(path)]) == 2
    err = capsys.readouterr().err
    assert "p.yaml:1" in err and "rope_theta" in err
