"""Stage `validate`, past the schemas: the legality of a parallel layout (integer rules and placement on the
network tiers, `layout`) and checks across fields that a schema alone cannot express (`cross_field`)."""
