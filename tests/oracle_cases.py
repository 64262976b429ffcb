"""Twenty varied problems on which CP-SAT must reach the exhaustive oracle's optimum (issue 3, item 5):
1B to 1T parameters, 8 to 16,384 GPUs, A100 and H100 (and V100), loose and tight memory, fixed and free
knobs, idle GPUs allowed or not, long sequences with context parallelism; and (issue 6) mixtures of experts
with ep and etp free, with and without context parallelism."""

CASES = {
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
search: {vpp: 1, micro_batch: {max: 2}, ep_dispatcher: [alltoall, flex], ep_overlap: [false, true]}
""",
}
