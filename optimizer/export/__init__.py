"""Exports of a plan to training-framework configurations.

One module per target, each with ``emit(problem, execution) -> str``. Only Megatron-LM is
implemented so far (NeMo 2, torchtitan and DeepSpeed are not yet written).
"""
from . import megatron

EMITTERS = {"megatron": megatron.emit}


def emit(target: str, problem, execution) -> str:
    """Render ``execution`` (a resolved schema Execution) of ``problem`` for ``target``."""
    if target not in EMITTERS:
        raise ValueError(f"unknown export target {target!r}; known: {', '.join(sorted(EMITTERS))}")
    return EMITTERS[target](problem, execution)
