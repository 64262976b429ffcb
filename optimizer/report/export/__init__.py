"""Exports of a plan to training-framework configurations.

One module per target, each with ``emit(problem, execution) -> str``: Megatron-LM (a runnable bash command),
NeMo 2 (recipe overrides, Python), torchtitan (job config, TOML), DeepSpeed (config, JSON), MaxText
(config overrides, key=value).
"""

from optimizer.report.export import deepspeed, maxtext, megatron, nemo, torchtitan

EMITTERS = {
    "megatron": megatron.emit,
    "nemo": nemo.emit,
    "torchtitan": torchtitan.emit,
    "deepspeed": deepspeed.emit,
    "maxtext": maxtext.emit,
}
TITLES = {
    "megatron": "Megatron-LM command",
    "nemo": "NeMo 2 recipe overrides",
    "torchtitan": "torchtitan config",
    "deepspeed": "DeepSpeed config",
    "maxtext": "MaxText config overrides",
}


def emit(target: str, problem, execution) -> str:
    """Render ``execution`` (a resolved schema Execution) of ``problem`` for ``target``."""
    if target not in EMITTERS:
        raise ValueError(f"unknown export target {target!r}; known: {', '.join(sorted(EMITTERS))}")
    return EMITTERS[target](problem, execution)


STACK_OF = {
    "megatron": "megatron-core",
    "nemo": "megatron-core",
    "torchtitan": "torchtitan",
    "deepspeed": "deepspeed",
    "maxtext": "maxtext",
}


def stack_warnings(target: str, execution) -> list[str]:
    """Knobs of the plan that the target framework does not offer (`optimizer.schema.stack`)."""
    from optimizer.rules.cross_field import execution_warnings

    return execution_warnings(STACK_OF[target], execution)


def block(target: str, problem, execution) -> str:
    """The export under its title, as the reports print it; knobs the target lacks are named above it (solve
    with `stack:` set to the target's framework to search only what it runs)."""
    warn = stack_warnings(target, execution)
    head = "".join(
        f"# warning: {w}; solve with `stack: {STACK_OF[target]}` to search only what it runs\n" for w in warn
    )
    return f"{TITLES[target]}:\n{head}{emit(target, problem, execution)}"
