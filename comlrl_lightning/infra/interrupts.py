"""Long work outside any training batch that SIGTERM / Ctrl+C may abandon at once (MARLHF's phase 1).

Inside a batch :class:`~comlrl_lightning.callbacks.InterruptCheckpoint` abandons the work at the signal
until the batch's first optimizer step (after it, the batch's updates finish, then it saves);
work that runs in a hook (``on_train_start``) is out of its sight, so a signal there waited for all of
it (MARLHF's preference pairs and reward-model epochs: forever with a hanging reward). A module wraps
such work in :func:`interruptible`, which hands it to every callback of the trainer that offers
``interruptible_phase`` (InterruptCheckpoint's contract: save what resumes, or stop at once saying
nothing is trained yet).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any


@contextmanager
def interruptible(trainer: Any, what: str, saved: Callable[[], bool]) -> Iterator[None]:
    """Run the ``with`` body as a phase an interrupt abandons at once (``what``: its name in messages;
    ``saved()``: whether its own resumable state is on disk yet). Without such a callback (or a
    trainer) the body runs as it is."""
    with ExitStack() as stack:
        for callback in getattr(trainer, "callbacks", None) or []:
            phase = getattr(callback, "interruptible_phase", None)
            if callable(phase):
                stack.enter_context(phase(trainer, what, saved))
        yield
