"""The sandbox's result types: :class:`SandboxResult`, :class:`TestReport` (imported by every mode; the
public face is :mod:`comlrl_lightning.coding.sandbox.api`). The limits, :class:`SandboxConfig`, are in
:mod:`comlrl_lightning.coding.sandbox.config` (re-exported here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from comlrl_lightning.coding.sandbox.config import BACKENDS as BACKENDS
from comlrl_lightning.coding.sandbox.config import SandboxConfig as SandboxConfig
from comlrl_lightning.coding.sandbox.launch import RawRun, signame

STATUSES = ("passed", "failed", "error", "timeout", "killed")


@dataclass
class SandboxResult:
    """The outcome of one step (loading the program, or one test).

    Attributes:
        status: ``"passed"``; ``"failed"`` (an assertion failed); ``"error"`` (another exception,
            including ``SystemExit``, an early ``os._exit`` (``EarlyExit``), forged results
            (``ResultTampering``)); ``"timeout"``; ``"killed"`` (by a signal, e.g. CPU limit).
        error_type: exception class name (``"NameError"``, ``"SyntaxError"``...), signal name
            for ``killed``, ``"Timeout"``; ``None`` when passed.
        message: bounded detail: the failing ``assert`` statement or the last traceback line.
        duration_s: seconds spent in the step (for the program: the whole run, wall clock).
        returncode: exit code of the sandboxed process (negative signal number), ``None`` if it
            was killed on timeout or is unknown.
    """

    status: str
    error_type: str | None = None
    message: str = ""
    duration_s: float = 0.0
    returncode: int | None = None

    @property
    def passed(self) -> bool:
        """Whether the step completed without an exception."""
        return self.status == "passed"


@dataclass
class TestReport:
    """All results of :func:`run_tests`.

    Attributes:
        program: result of loading the program (and the setup); not passed means it failed to
            load and every test carries its status.
        tests: one result per test, in order.
        stdout: tail of the child's stdout (bounded); stderr likewise.
        duration_s: wall-clock seconds of the whole run, as seen by the parent.
        isolation: the isolation layers actually applied (e.g. ``"pid-namespace"``, ``"uid=..."``).
        missing: the layers of :data:`~comlrl_lightning.coding.sandbox.isolation.ALL_LAYERS` not applied.
        sandbox_uid: the uid the code ran as, ``None`` if privileges were not dropped.
        tampered: the result channel held forged or malformed records (nothing counts as passed).
    """

    __test__ = False  # not a pytest test class

    program: SandboxResult
    tests: list[SandboxResult] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    isolation: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    sandbox_uid: int | None = None
    tampered: bool = False

    @property
    def program_loaded(self) -> bool:
        """Whether the program (and setup) ran to completion."""
        return self.program.passed

    @property
    def num_tests(self) -> int:
        """Number of tests."""
        return len(self.tests)

    @property
    def num_passed(self) -> int:
        """Number of passed tests."""
        return sum(t.passed for t in self.tests)

    @property
    def fraction_passed(self) -> float:
        """``num_passed / num_tests`` (0.0 with no tests)."""
        return self.num_passed / self.num_tests if self.tests else 0.0

    @property
    def all_passed(self) -> bool:
        """Program loaded, at least one test, and every test passed (pass@1 of one sample)."""
        return self.program_loaded and bool(self.tests) and self.num_passed == self.num_tests


def end_result(raw: RawRun, cfg: SandboxConfig) -> SandboxResult:
    """How the sandboxed run ended, as a result for the steps it did not report."""
    res, st = raw.res, raw.end_status
    returncode = (
        st.get("code")
        if st.get("kind") == "exited"
        else (-st["signal"] if st.get("kind") == "signaled" else None)
    )
    if res.get("launcher_died"):
        lim = cfg.max_message_chars
        return SandboxResult("killed", "LauncherDied", f"sandbox launcher died: {raw.stderr[-lim:]}"[:lim])
    if res["timed_out"]:
        return SandboxResult("timeout", "Timeout", f"run exceeded {cfg.timeout_s:g} s wall clock", 0.0, None)
    if st.get("oom"):
        return SandboxResult(
            "killed", "MemoryLimit", f"memory limit of {cfg.memory_mb} MB (cgroup) hit", 0.0, returncode
        )
    if st.get("kind") == "signaled":
        name = signame(st["signal"])
        return SandboxResult("killed", name, f"killed by {name} (resource limit or signal)", 0.0, returncode)
    if st.get("kind") == "exited":
        return SandboxResult(
            "error", "EarlyExit", f"exited with code {returncode} before reporting", 0.0, returncode
        )
    return SandboxResult("killed", "SandboxKilled", "the sandbox's init process was killed", 0.0, None)


def record_result(rec: dict, lim: int) -> SandboxResult:
    err, status = rec.get("e"), rec.get("s")
    return SandboxResult(
        status if status in STATUSES else "error",
        None if err is None else str(err)[:100],
        str(rec.get("m", ""))[:lim],
        float(rec.get("d") or 0.0) if type(rec.get("d")) is float else 0.0,
    )
