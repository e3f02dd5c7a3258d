"""Infrastructure: the agent-parallel strategy (placement), atomic checkpoint I/O, RNG states, what a resume may
change (resume_config), one run per folder (run_lock), phases outside batches a SIGTERM abandons (interrupts)."""
