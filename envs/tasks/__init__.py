"""The seeded task factory: task families, their checkers, the builder and the validator."""
