"""The warnings a shipped config may print when it fits (tests/test_start_up_warnings.py), each with why
it stays. Anything else a fit of a shipped config warns about fails that test: fix it at its source,
or silence it precisely where it arises (``comlrl_lightning.cli.silence_start_up_noise``) with a
comment saying why, or add it here with the reason."""

ALLOWED: list[tuple[str, str]] = [
    (
        r"The '(train|val)_dataloader' does not have many workers",
        "a batch is a list of dict rows (no decoding, no tensors): worker processes would only copy "
        "the rows and the reward's sandbox pool; the time is in generation",
    ),
    (
        r"`Trainer\(limit_(train|val)_batches=1\)` was configured",
        "the test itself shortens the run to one batch",
    ),
]
