"""Exports of a plan to training-framework configurations.

One module per target, each with ``emit(problem, execution) -> str``: Megatron-LM (a runnable bash command),
NeMo 2 (recipe overrides, Python), torchtitan (job config, TOML), DeepSpeed (config, JSON).
"""
from . import deepspeed, megatron, nemo, torchtitan

EMITTERS = {"megatron": megatron.emit, "nemo": nemo.emit, "torchtitan": torchtitan.emit, "deepspeed": deepspeed.emit}
TITLES = {"megatron": "Megatron-LM command", "nemo": "NeMo 2 recipe overrides", "torchtitan": "torchtitan config",
          "deepspeed": "DeepSpeed config"}


def emit(target: str, problem, execution) -> str:
    """Render ``execution`` (a resolved schema Execution) of ``problem`` for ``target``."""
    if target not in EMITTERS:
        raise ValueError(f"unknown export target {target!r}; known: {', '.join(sorted(EMITTERS))}")
    return EMITTERS[target](problem, execution)


def block(target: str, problem, execution) -> str:
    """The export under its title, as the reports print it."""
    return f"{TITLES[target]}:\n{emit(target, problem, execution)}"
