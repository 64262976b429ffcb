"""What is modelled as constraints (CP-SAT): one module per piece, each `build(ctx) -> PieceVars`.

Filled by the solver issue; the tables these modules use come from `optimizer.model`, never a second
copy of the physics.
"""
