"""The commands, one module each: each runs the stages (load -> validate -> prepare -> build -> solve ->
extract -> verify) for its question and returns a result that `optimizer.report` renders."""
