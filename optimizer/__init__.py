"""paraplan: plans LLM training as a constraint-optimization problem.

Stages, each a module: load (`loader`) -> validate (`schema`) -> prepare -> build (`formulations`)
-> solve -> extract -> verify -> report. The analytical model of a training step lives in
`optimizer.model` and is the single source of truth for time and memory.
"""

__version__ = "0.1.0"
