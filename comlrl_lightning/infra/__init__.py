"""Infrastructure: the agent-parallel strategy (placement), atomic checkpoint I/O, RNG states."""
