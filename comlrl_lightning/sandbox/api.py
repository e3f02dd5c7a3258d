"""Run untrusted Python code (generated programs) without risk to training, and without trusting it.

Generated code may loop forever, fork-bomb, allocate without bound, kill its parent, write
anywhere, exit early, introspect its own process or print a fake result. None of that may stop,
slow (beyond its timeout) or corrupt training, reach the host, or raise its own score.

**Verdicts are not decided here.** :func:`~comlrl_lightning.sandbox.calls.run_calls`, what rewards use, loads the program and
calls its entry point on the given *inputs*; the sandboxed process returns *outputs* as plain data
(:mod:`comlrl_lightning.sandbox.plain`: exact builtin types, size-capped; anything else is an
``UnsupportedOutput`` failure) and never holds an expected value, a test, a nonce or a verdict, so
nothing it can reach is worth forging. A trusted judge compares
(:mod:`comlrl_lightning.tasks.coding.judge`). :func:`~comlrl_lightning.sandbox.calls.run_record` runs *trusted* code (a reference
solution) to record the inputs its tests use. :func:`run_tests` runs test statements inside the
sandboxed process and reports their statuses: its verdict can be forged by the program, so it is
for containment checks and trusted code only.

**Containment** (:mod:`.isolation` for the layers, :mod:`.runner` for the launcher): training
starts ``runner.py`` in a new session and never forks untrusted code; the launcher stages a
read-only view, creates a cgroup per run (memory counting shared memory and memfd, pids), drops
to an unused uid with a fresh session keyring and rlimits (address space, CPU, file size,
processes, open files, no core dumps), and execs ``bwrap`` (user, PID, mount, network, IPC, UTS,
cgroup namespaces; only the interpreter, its standard library and the harness visible, no
site-packages; private ``/dev``; one scratch tmpfs writable; a seccomp filter against new
namespaces, mounts, keyrings, io_uring, ptrace and SysV/POSIX IPC). Wall-clock deadlines in the
harness (per call), the launcher (SIGKILL to the namespace's PID 1, then the cgroup) and the parent
(backstop). Where bubblewrap cannot run, the fallback launcher (:mod:`.nsinit`) applies what the OS
allows; every report lists the layers applied (:attr:`TestReport.isolation`) and missing
(:attr:`TestReport.missing`), and the missing ones are logged once per process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from comlrl_lightning.sandbox.harness import parse_records
from comlrl_lightning.sandbox.launch import RawRun, SandboxError, launch, signame

STATUSES = ("passed", "failed", "error", "timeout", "killed")
BACKENDS = ("auto", "bwrap", "fallback")
__all__ = [
    "CallsReport",
    "SandboxConfig",
    "SandboxError",
    "SandboxPool",
    "SandboxResult",
    "TestJob",
    "TestReport",
    "run_calls",
    "run_record",
    "run_tests",
]


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
        missing: the layers of :data:`~comlrl_lightning.sandbox.isolation.ALL_LAYERS` not applied.
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


def run_tests(
    program: str,
    tests: Sequence[str] = (),
    *,
    setup: str = "",
    config: SandboxConfig | None = None,
    **overrides: object,
) -> TestReport:
    """Run ``program`` once, then ``setup``, then each test statement separately, in a sandbox.

    The statuses are decided inside the sandboxed process (see the module docstring): use it for
    trusted code and containment checks, not to score untrusted code.

    Args:
        program: source code to run.
        tests: statements, each run on its own with its own timeout in the program's namespace,
            e.g. ``"assert add(1, 2) == 3"``. Multi-statement strings are fine.
        setup: scaffolding run after the program, before the tests; if it fails, the program
            counts as failed to load.
        config: limits; defaults to :class:`SandboxConfig`.
        **overrides: :class:`SandboxConfig` fields overriding ``config`` (e.g. ``timeout_s=1``).

    Returns:
        A :class:`TestReport`. If the program hangs, dies or fails to load, every test carries
        that status; if the run times out mid-way, unreported tests are ``"timeout"``.

    Raises:
        SandboxError: the sandbox could not be started or crashed (not the code's fault).
        ValueError: an unknown or invalid config field.
    """
    cfg = (config or SandboxConfig()).replace(**overrides)
    tests = [str(t) for t in tests]
    nonce = os.urandom(16).hex()
    raw = launch({"mode": "tests", "program": program, "tests": tests, "setup": setup, "nonce": nonce}, cfg)
    return _tests_report(raw, cfg, nonce, len(tests))


def _end_result(raw: RawRun, cfg: SandboxConfig) -> SandboxResult:
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


def _tests_report(raw: RawRun, cfg: SandboxConfig, nonce: str, num_tests: int) -> TestReport:
    lim, end = cfg.max_message_chars, _end_result(raw, cfg)
    res, returncode = raw.res, end.returncode
    kw = {"stdout": raw.stdout, "stderr": raw.stderr, "duration_s": raw.duration_s, "sandbox_uid": raw.uid}
    try:
        program_rec, test_recs, iso = parse_records(res["records"], nonce, num_tests, STATUSES)
        tampered = bool(res["overflow"])
    except ValueError:
        program_rec, test_recs, iso, tampered = None, [], [], True
    isolation, kw["missing"] = raw.layers(
        [] if raw.bwrap else iso
    )  # bubblewrap: layers from the launcher only
    if tampered:
        bad = SandboxResult("error", "ResultTampering", "forged or malformed result records", 0.0, returncode)
        return TestReport(
            bad,
            [dataclasses.replace(bad) for _ in range(num_tests)],
            isolation=isolation,
            tampered=True,
            **kw,
        )
    program = _result(program_rec, lim) if program_rec else dataclasses.replace(end)
    program.returncode = returncode
    tests = [_result(r, lim) for r in test_recs]
    if not program.passed:
        note = f"program failed to load: {program.message}"[:lim]
        tests = [
            SandboxResult(program.status, program.error_type, note, 0.0, returncode) for _ in range(num_tests)
        ]
    else:
        for t in tests:
            t.returncode = returncode
        tests += [dataclasses.replace(end) for _ in range(num_tests - len(tests))]
    program.duration_s = raw.duration_s
    return TestReport(program, tests, isolation=isolation, **kw)


def _result(rec: dict, lim: int) -> SandboxResult:
    err, status = rec.get("e"), rec.get("s")
    return SandboxResult(
        status if status in STATUSES else "error",
        None if err is None else str(err)[:100],
        str(rec.get("m", ""))[:lim],
        float(rec.get("d") or 0.0) if type(rec.get("d")) is float else 0.0,
    )


from comlrl_lightning.sandbox.calls import CallsReport, run_calls, run_record  # noqa: E402 - re-exported
from comlrl_lightning.sandbox.pool import SandboxPool, TestJob  # noqa: E402 - re-exported
