"""The sandbox's limits and isolation switches: :class:`SandboxConfig` (the launcher and every mode read
it; the public face is :mod:`comlrl_lightning.coding.sandbox.api`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

BACKENDS = ("auto", "bwrap", "fallback")


@dataclass
class SandboxConfig:
    """Limits and isolation switches for one sandboxed run.

    Args:
        timeout_s: wall-clock limit in seconds for the whole run (program and all tests).
        test_timeout_s: per-step limit in seconds (loading the program, the setup, each test),
            enforced inside the child with ``setitimer``; the wall clock is the backstop.
        cpu_time_s: ``RLIMIT_CPU`` in seconds per process; ``None``: ``ceil(timeout_s) + 1``.
        memory_mb: ``RLIMIT_AS`` (address space) in MB per process.
        file_size_mb: ``RLIMIT_FSIZE`` in MB (largest file the code may write, stdout included).
        disk_mb: size in MB of each private tmpfs (working directory, ``/tmp``...).
        max_processes: ``RLIMIT_NPROC``: processes/threads the sandbox uid may have.
        namespaces: isolate with namespaces (bubblewrap, else ``unshare``) where the OS allows it.
        backend: ``"auto"`` (bubblewrap when a trial run works, else the fallback launcher),
            ``"bwrap"`` (required: :class:`SandboxError` if it cannot run) or ``"fallback"``.
        drop_privileges: when running as root, run the code as an unused uid.
        uid: that uid; ``None`` picks a random unused one per run (falls back to ``nobody``).
        hash_seed: ``PYTHONHASHSEED`` of the child (``None``: random).
        max_message_chars: bound on :attr:`SandboxResult.message`.
        max_output_chars: bound on the captured stdout/stderr tails.
        startup_grace_s: extra seconds the parent waits for the launcher beyond ``timeout_s``
            before killing its whole process group.

    Raises:
        ValueError: a limit is not positive, ``uid`` is root, or ``backend`` is unknown.
    """

    timeout_s: float = 5.0
    test_timeout_s: float = 2.0
    cpu_time_s: int | None = None
    memory_mb: int = 1024
    file_size_mb: int = 16
    disk_mb: int = 64
    max_processes: int = 32
    namespaces: bool = True
    backend: str = "auto"
    drop_privileges: bool = True
    uid: int | None = None
    hash_seed: int | None = 0
    max_message_chars: int = 400
    max_output_chars: int = 4000
    startup_grace_s: float = 5.0

    def __post_init__(self) -> None:
        for name in (
            "timeout_s",
            "test_timeout_s",
            "memory_mb",
            "file_size_mb",
            "disk_mb",
            "max_processes",
            "max_message_chars",
            "max_output_chars",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"SandboxConfig.{name}: got {value!r}; must be a positive number")
        if self.startup_grace_s < 0:
            raise ValueError(f"SandboxConfig.startup_grace_s: got {self.startup_grace_s!r}; must be >= 0")
        if self.uid is not None and not 0 < self.uid < 2**32 - 1:
            raise ValueError(f"SandboxConfig.uid: got {self.uid!r}; must be a non-root uid (or None)")
        if self.backend not in BACKENDS:
            raise ValueError(f"SandboxConfig.backend: got {self.backend!r}; allowed: {list(BACKENDS)}")
        if self.cpu_time_s is not None and self.cpu_time_s <= 0:
            raise ValueError(f"SandboxConfig.cpu_time_s: got {self.cpu_time_s!r}; must be positive or None")

    def replace(self, **overrides: object) -> SandboxConfig:
        """A copy with some fields changed. Raises ``ValueError`` for an unknown field."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"SandboxConfig: unknown field(s) {unknown}; allowed: {sorted(names)}")
        return dataclasses.replace(self, **overrides) if overrides else self
