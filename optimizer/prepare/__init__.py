"""Stage `prepare`: the candidate space of a problem (`space`) and what plans are ranked by (`objective`),
shared by every formulation (`formulations/`)."""
