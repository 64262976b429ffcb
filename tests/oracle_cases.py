"""The problems on which CP-SAT (and the Pyomo MILP) must reach the exhaustive oracle's optimum.

ORACLE: varied problems, 1B to 1T parameters, 8 to 16,384 GPUs, A100 and H100 (and V100), loose and tight
memory, fixed and free knobs, idle GPUs allowed or not, long sequences with context parallelism, mixtures of
experts with ep and etp free (with and without context parallelism), and the other objectives. SMALL: tiny
problems that each exercise one formulation feature. Their enumerated optima are stored in
tests/golden/oracle_optima.json, written only by scripts/regen_oracle.py.
"""

ORACLE = {
    "1.7b-8xa100-40": """
llm: narayanan2021-1.7b
system: a100-sxm-40gb
num_gpus: 8
training: {global_batch: 64}
""",
    "3.6b-16xa100-80": """
llm: narayanan2021-3.6b
system: a100-sxm-80gb
num_gpus: 16
training: {global_batch: 128}
""",
    "llama8b-8xh100-tight": """
llm: llama3.1-8b
system: h100-sxm-80gb
num_gpus: 8
training: {global_batch: 16, precision: bf16}
options: {memory_headroom_gib: 40}
""",
    "7.5b-32xa100-40-tight": """
llm: narayanan2021-7.5b
system: a100-sxm-40gb
num_gpus: 32
training: {global_batch: 128}
options: {memory_headroom_gib: 24}
""",
    "mpt7b-64xa100-40": """
llm: mpt-7b
system: a100-sxm-40gb
num_gpus: 64
training: {global_batch: 512, precision: bf16}
""",
    "nemotron15b-256xh100": """
llm: nemotron4-15b
system: h100-sxm-80gb
num_gpus: 256
training: {global_batch: 1024, precision: bf16}
""",
    "18.4b-256xa100-80": """
llm: narayanan2021-18.4b
system: a100-sxm-80gb
num_gpus: 256
training: {global_batch: 1024}
""",
    "22b-64xh100-headroom": """
llm: megatron-22b
system: h100-sxm-80gb
num_gpus: 64
training: {global_batch: 256, precision: bf16}
options: {memory_headroom_gib: 30}
""",
    "39.1b-512xa100-80": """
llm: narayanan2021-39.1b
system: a100-sxm-80gb
num_gpus: 512
training: {global_batch: 1536}
""",
    "llama70b-1024xh100-8k": """
llm: llama3.1-70b
system: h100-sxm-80gb
num_gpus: 1024
training: {global_batch: 512, precision: bf16}
""",
    "llama70b-512xa100-fixed": """
llm: llama3.1-70b
system: a100-sxm-80gb
num_gpus: 512
training: {global_batch: 512, precision: bf16}
search: {zero: 1, dp_overlap: true, vpp: {max: 4}, cp: [1, 2]}
""",
    "76.1b-1000xa100-idle": """
llm: narayanan2021-76.1b
system: a100-sxm-80gb
num_gpus: 1000
training: {global_batch: 1792}
options: {allow_idle_gpus: true}
search: {cp: 1, vpp: {max: 4}}
""",
    # the other objectives, where the presolve's incumbent was weak (GPUs x time) or its slack spanned
    # seconds (GPUs x 10^5 s + time): CP-SAT timed out or took 18 s per solve
    "llama70b-upto1000xh100-tokens-per-gpu": """
llm: llama3.1-70b
system: h100-sxm-80gb
num_gpus: 1000
training: {global_batch: 640}
options: {allow_idle_gpus: true}
search: {cp: 1, vpp: {max: 2}}
objective: {goal: tokens_per_gpu}
""",
    "22b-upto512xh100-fewest-gpus": """
llm: megatron-22b
system: h100-sxm-80gb
num_gpus: 512
training: {global_batch: 512}
options: {allow_idle_gpus: true, gpu_multiple: 8}
search: {cp: 1, vpp: {max: 2}}
objective: {goal: fewest_gpus, max_step_time_s: 4.0}
""",
    "gpt3-1024xh100": """
llm: gpt3-175b
system: h100-sxm-80gb
num_gpus: 1024
training: {global_batch: 1536, precision: bf16}
""",
    "gpt3-1024xh100-fixed": """
llm: gpt3-175b
system: h100-sxm-80gb
num_gpus: 1024
training: {global_batch: 1536, precision: bf16}
search: {tp: 8, pp: [4, 8, 16], recompute: full}
""",
    "gpt3-4096xa100": """
llm: gpt3-175b
system: a100-sxm-80gb
num_gpus: 4096
training: {global_batch: 1536}
""",
    "145.6b-1536xa100": """
llm: narayanan2021-145.6b
system: a100-sxm-80gb
num_gpus: 1536
training: {global_batch: 2304}
""",
    "530b-2240xa100": """
llm: turing-530b
system: a100-sxm-80gb
num_gpus: 2240
training: {global_batch: 1920}
""",
    "1t-3072xa100-40": """
llm: megatron-1t
system: a100-sxm-40gb
num_gpus: 3072
training: {global_batch: 3072}
""",
    "1008b-16384xh100": """
llm: narayanan2021-1008b
system: h100-sxm-80gb
num_gpus: 16384
training: {global_batch: 8192, precision: bf16}
""",
    "405b-16384xh100-8k": """
llm: llama3.1-405b
system: h100-sxm-80gb
num_gpus: 16384
training: {global_batch: 2048, precision: bf16}
search: {vpp: {max: 8}}
""",
    "mixtral-8x7b-64xh100": """
llm: mixtral-8x7b
system: h100-sxm-80gb
num_gpus: 64
training: {global_batch: 256, seq_len: 4096, precision: bf16}
""",
    "mixtral-8x7b-32k-cp-64xh100": """
llm: mixtral-8x7b
system: h100-sxm-80gb
num_gpus: 64
training: {global_batch: 64, precision: bf16}
""",
    "llama8b-128k-cp-comm-64xh100": """
llm: llama3.1-8b
system: h100-sxm-80gb
num_gpus: 64
training: {global_batch: 16, seq_len: 131072, precision: bf16}
search: {cp_comm: [p2p, all_gather, a2a, a2a_p2p]}
""",
    "qwen3-235b-256xh100": """
llm: qwen3-235b-a22b
system: h100-sxm-80gb
num_gpus: 256
training: {global_batch: 1024, seq_len: 4096, precision: bf16}
search: {vpp: {max: 2}}
""",
    "qwen3-235b-ep-dispatch-overlap-128xh100": """
llm: qwen3-235b-a22b
system: h100-sxm-80gb
num_gpus: 128
training: {global_batch: 512, seq_len: 4096, precision: bf16}
search: {vpp: 1, micro_batch: {max: 2}, moe_dispatcher: [alltoall, flex], ep_overlap: [false, true]}
""",
}

# small problems that exercise one formulation feature each (kernels, schedule, offload, embedding/loss
# slots, uneven pipeline splits (13 layers: no pp > 1 divides them), experts); tests/test_solve_cpsat.py
# solves several of them again for their own assertions
SMALL = {
    "dense-8gpu": """
llm: {name: tiny, hidden: 1024, ffn: 4096, layers: 8, heads: 16, seq_len: 1024, vocab: 32000}
system: a100-sxm-80gb
num_gpus: 8
training: {global_batch: 16}
""",
    "gqa-swiglu-16gpu-tight-memory": """
llm: {name: g, hidden: 2048, ffn: 5632, layers: 16, heads: 16, kv_heads: 4, seq_len: 2048, vocab: 32000,
      mlp: swiglu}
system: {base: h100-sxm-80gb, hbm_gib: 6}
num_gpus: 16
training: {global_batch: 32}
search: {cp: 1}
""",
    "fixed-knobs": """
llm: {name: f, hidden: 1024, ffn: 4096, layers: 12, heads: 16, seq_len: 2048, vocab: 50000}
system: a100-sxm-40gb
num_gpus: 16
training: {global_batch: 64}
search: {tp: [2, 4], recompute: [none, selective], vpp: {max: 2}, cp: 1}
""",
    "open-kernels-schedule-16gpu": """
llm: {name: k, hidden: 1024, ffn: 4096, layers: 8, heads: 16, seq_len: 2048, vocab: 32000, dropout: true,
      bias: true}
system: a100-sxm-40gb
num_gpus: 16
training: {global_batch: 32}
search: {fused_layers: [true, false], attention: [flash, standard], schedule: [1f1b, gpipe],
         pp_rs_ag: [true, false], sp_ag_redo: [true, false], cp: 1}
""",
    "offload-13b-8gpu-24gib": """
llm: {name: o, hidden: 5120, ffn: 20480, layers: 40, heads: 40, seq_len: 2048, vocab: 32000}
system: {base: h100-sxm-80gb, hbm_gib: 24, offload: {capacity_gib: 256, bandwidth_gbps: 50}}
num_gpus: 8
training: {global_batch: 32, precision: bf16}
search: {cp: 1}
options: {memory_headroom_gib: 0}
""",
    "embedding-loss-slots-16gpu": """
llm: {name: e, hidden: 2048, ffn: 8192, layers: 14, heads: 16, seq_len: 2048, vocab: 128000}
system: a100-sxm-80gb
num_gpus: 16
training: {global_batch: 64}
search: {pp: [4, 8], cp: 1}
""",
    "uneven-pipeline-16gpu": """
llm: {name: u, hidden: 5120, ffn: 20480, layers: 13, heads: 40, seq_len: 2048, vocab: 32000}
system: a100-sxm-40gb
num_gpus: 16
training: {global_batch: 64}
search: {pp: [2, 4, 8], pp_uneven: [false, true], cp: 1, zero: [0, 1]}
""",
    "mtp-custom-layout-16gpu": """
llm: {name: t, hidden: 2048, ffn: 4096, layers: 12, heads: 16, kv_heads: 4, seq_len: 2048, vocab: 64000,
      mlp: swiglu, mtp_layers: 1, moe: {experts: 16, top_k: 2, expert_ffn: 1408, shared_experts: 1}}
system: h100-sxm-80gb
num_gpus: 16
training: {global_batch: 64}
options: {memory_headroom_gib: 60.69}
search: {pp: [2, 4, 8], pp_uneven: [false, true], cp: 1, zero: [0, 1]}
""",
    "moe-ep-etp-16gpu": """
llm: {name: m, hidden: 2048, ffn: 4096, layers: 8, heads: 16, kv_heads: 4, seq_len: 2048, vocab: 32000,
      mlp: swiglu, moe: {experts: 16, top_k: 2, expert_ffn: 1408, shared_experts: 1}}
system: h100-sxm-80gb
num_gpus: 16
training: {global_batch: 64, precision: fp8}
search: {cp: [1, 2]}
""",
}

# every case the oracle test compares CP-SAT with; tests/golden/oracle_optima.json holds their optima
CASES = {**SMALL, **ORACLE}
