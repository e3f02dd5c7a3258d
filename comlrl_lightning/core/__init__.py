"""The algorithm core: generation, the rollout, advantages and losses (pure functions and records)."""
