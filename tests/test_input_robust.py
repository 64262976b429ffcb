"""Input robustness of the readers and the system schema: bad files and bad values end in exit 2 with
file:line:field (or the config key), never a traceback, a hang or an unbounded read."""

from __future__ import annotations

import json
import os
import time

import pytest
from helpers import run_cli

from optimizer.cli import main

SYS_PROBLEM = (
    "name: sys\nllm: llama3.1-8b\nsystem: {{base: h100-sxm-80gb, {field}}}\nnum_gpus: 16\n"
    "training: {{global_batch: 64, precision: bf16, tokens: 1.0e+9}}\n"
)


run = run_cli  # (exit code, stdout, stderr, path)


def assert_input_error(rc, err, path, field, words=""):
    assert rc == 2, err
    lines = [x for x in err.splitlines() if x.startswith("error: ")]
    hit = [x for x in lines if x.startswith(f"error: {path}") and field in x and words in x]
    assert hit, (field, words, lines)


@pytest.mark.parametrize(
    "field, where, words",
    [
        ('hbm_gib: "120"', "system.hbm_gib", "number"),
        ("hbm_gib: 1.0e+16", "system.hbm_gib", "<="),
        ("hbm_gib: 1.0e+14", "system.hbm_gib", "<="),
        ("gpus_per_node: 100000000000", "system.gpus_per_node", "<="),
        ("hbm_bandwidth_gbps: 1.0e+300", "system.hbm_bandwidth_gbps", "<="),
        (
            "networks: [{name: nvlink, size: 8, bandwidth_gbps: 450.0, latency_us: 3, efficiency: 0.8}, "
            "{name: ib, size: 1180591620717411303424, bandwidth_gbps: 50.0, latency_us: 5, efficiency: 0.8}]",
            "system.networks.1.size",
            "<=",
        ),
        (
            'networks: [{name: nvlink, size: 8, bandwidth_gbps: 450.0, latency_us: 3, efficiency: "0.8"}]',
            "system.networks.0.efficiency",
            "number",
        ),
        ("clock_scale: true", "system.clock_scale", ""),
    ],
)
def test_system_fields_strict_and_bounded(tmp_path, capsys, field, where, words):
    rc, _, err, path = run(tmp_path, capsys, SYS_PROBLEM.format(field=field))
    assert_input_error(rc, err, path, where, words)


TAG_PROBLEM = (
    "name: t\nllm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 16\n"
    "training: {{global_batch: 64, precision: bf16, tokens: 1.0e+9}}\noptions: {{allow_idle_gpus: {value}}}\n"
)


@pytest.mark.parametrize(
    "value, words",
    [
        ("!!bool maybe", "'maybe' is not a boolean"),
        ("!!int abc", "invalid value"),
        ("!!timestamp xyz", "'xyz' is not a !!timestamp"),
    ],
)
def test_explicit_tag_on_a_value_it_does_not_fit(tmp_path, capsys, value, words):
    rc, _, err, path = run(tmp_path, capsys, TAG_PROBLEM.format(value=value), command="check")
    assert_input_error(rc, err, path + ":6:", "options.allow_idle_gpus", words)


def test_explicit_bool_tag_on_a_key(tmp_path, capsys):
    rc, _, err, path = run(tmp_path, capsys, "name: t\n!!bool maybe: 3\n", command="check")
    assert_input_error(rc, err, path + ":2:", "", "not a boolean")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_device_refused_before_reading(capsys, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    assert main(["check", device]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"error: {device}: " in err and "not a regular file" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
@pytest.mark.parametrize("command", ["check", "study"])
def test_fifo_refused_without_blocking(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    os.mkfifo("f.yaml")
    (tmp_path / "st.yaml").write_text("name: s\nbase: f.yaml\naxes: {num_gpus: [8]}\n", encoding="utf-8")
    t0 = time.perf_counter()
    assert main([command, "f.yaml" if command == "check" else "st.yaml"]) == 2
    assert time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    # check names the FIFO; a study names its own base line, where the FIFO was written
    where = "error: f.yaml: " if command == "check" else "error: st.yaml:2: base: f.yaml: "
    assert "Traceback" not in err and where in err and "not a regular file (a FIFO)" in err


def test_read_is_bounded(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"# " + b"x" * (4 * 2**20 + 10) + b"\n")
    assert main(["check", str(path)]) == 2
    assert "file too large" in capsys.readouterr().err


@pytest.mark.parametrize("field, line", [("llm", 1), ("system", 2)])
def test_an_unreadable_reference_names_the_line_that_references_it(
    tmp_path, capsys, monkeypatch, field, line
):
    """A referenced llm:/system: file that is too large, a folder or a FIFO: the error names the problem's
    line that references it (the referenced file has no line to point at), and what is wrong."""
    monkeypatch.chdir(tmp_path)
    refs = {"llm": "llama3.1-8b", "system": "h100-sxm-80gb"}
    for name, make in (
        ("big.yaml", lambda p: p.write_bytes(b"#" * (4 * 2**20 + 10))),
        ("dir.yaml", lambda p: p.mkdir()),
        ("fifo.yaml", lambda p: os.mkfifo(p)),
    ):
        make(tmp_path / name)
        body = dict(refs, **{field: name})
        (tmp_path / "p.yaml").write_text(
            f"llm: {body['llm']}\nsystem: {body['system']}\nnum_gpus: 8\ntraining: {{global_batch: 8}}\n"
        )
        assert main(["check", "p.yaml"]) == 2
        err = capsys.readouterr().err
        assert f"p.yaml:{line}: {field}: " in err, err
        assert ("file too large" if name == "big.yaml" else "not a regular file") in err, err


def test_check_with_a_precision_list(tmp_path, capsys):
    """`check` of a problem whose search opens several precisions answers (it crashed reading the
    precision's enum value from a string)."""
    body = (
        "name: small-precisions\nllm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 16\n"
        "training: {global_batch: 64, precision: bf16, tokens: 1.0e+9}\nsearch: {precision: [bf16, fp8]}\n"
    )
    rc, out, err, _ = run(tmp_path, capsys, body, command="check")
    assert rc == 0, err
    assert "checked in" in out + err


def test_check_with_a_precision_list_and_no_legal_layout(tmp_path, capsys):
    """No layout is legal at any precision (37 GPUs): the reason is the rules, explained as such (the
    fuzzer found it reported as memory, then a traceback looking for the smallest-memory plan)."""
    body = (
        "name: no-layout\nllm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 37\n"
        "training: {global_batch: 64, precision: bf16}\nsearch: {precision: [bf16, fp8]}\n"
    )
    rc, out, err, _ = run(tmp_path, capsys, body, command="check")
    assert rc == 3 and "Traceback" not in err, err
    assert "no legal plan" in out and "rules.gpus" in out


MIXTRAL = {
    "model_type": "mixtral",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


@pytest.mark.parametrize(
    "change, words",
    [
        ({"hidden_size": "1e400"}, "hidden_size: must be an integer, not inf"),
        ({"num_hidden_layers": 10**12}, "num_hidden_layers: must be in 0.."),
        ({"num_hidden_layers": 10**8, "mlp_only_layers": [1]}, "num_hidden_layers: must be in 0.."),
        ({"hidden_size": None}, "hidden_size: must be an integer, not null"),
        ({"hidden_size": 4096.9}, "hidden_size: must be an integer, not 4096.9"),
        ({"mlp_only_layers": 5}, "mlp_only_layers: must be a list of layer indices"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings: must be true or false, not a string"),
        ({"num_local_experts": "8"}, "num_local_experts: must be an integer, not a string"),
        ({"x": "DEEP"}, "nested too deeply"),
    ],
)
def test_malformed_hf_config(tmp_path, capsys, change, words):
    cfg = tmp_path / "m" / "config.json"
    cfg.parent.mkdir()
    text = json.dumps({**MIXTRAL, **change}).replace('"1e400"', "1e400")
    cfg.write_text(text.replace('"DEEP"', "[" * 100_000 + "]" * 100_000), encoding="utf-8")
    body = f"name: hf\nllm: {cfg}\nsystem: h100-sxm-80gb\nnum_gpus: 64\ntraining: {{global_batch: 256}}\n"
    t0 = time.perf_counter()
    rc, _, err, path = run(tmp_path, capsys, body, command="evaluate")
    assert time.perf_counter() - t0 < 5
    assert_input_error(rc, err, path + ":2:", f"llm: {cfg}: ", words)


def test_hf_moe_layer_count_unchanged(tmp_path):
    """The sparse-layer count, now counted rather than listed, is the list's length."""
    from optimizer.io.hf_config import to_llm

    qwen = {**MIXTRAL, "model_type": "qwen2_moe", "num_hidden_layers": 24, "decoder_sparse_step": 2}
    assert to_llm({**qwen, "mlp_only_layers": [1, 2, 5]}, "q")["moe"]["moe_layers"] == 12 - 2
    assert "moe_layers" not in to_llm(MIXTRAL, "m")["moe"]
    ds = {**MIXTRAL, "first_k_dense_replace": 3}
    assert to_llm(ds, "d")["moe"]["moe_layers"] == 29


def test_evaluate_without_an_execution_is_refused_by_name(tmp_path, capsys):
    """`evaluate` scores a written plan: a file without `execution:` is exit 2 naming the field and pointing
    at `solve`, not an answer for the schema's all-default tp 1 / pp 1 / unsharded plan (which needs
    thousands of GiB per GPU and read as the model's verdict). With an execution it evaluates; `solve` on
    the same file still searches."""
    body = "llm: gpt3-175b\nsystem: h100-sxm-80gb\nnum_gpus: 1024\ntraining: {global_batch: 1024}\n"
    rc, out, err, path = run_cli(tmp_path, capsys, body, command="evaluate")
    assert rc == 2 and out == ""
    assert f"{path}:1: execution: required field is missing" in err and "paraplan solve" in err
    rc, out, _, _ = run_cli(
        tmp_path, capsys, body + "execution: {tp: 8, pp: 8, micro_batch: 1}\n", "--json", command="evaluate"
    )
    assert rc == 0 and json.loads(out)["execution"]["tp"] == 8
