"""Run untrusted Python code (generated programs and their tests) without risk to training.

Generated code may loop forever, fork-bomb, allocate without bound, kill its parent, write
anywhere, exit early or print a fake result. None of that may stop, slow (beyond its timeout) or
corrupt training. Layers, each applied where the OS allows it (what was applied is listed in
:attr:`TestReport.isolation`); the process side lives in :mod:`comlrl_lightning.sandbox.runner`,
the in-child test harness in :mod:`comlrl_lightning.sandbox.harness`:

- **Intermediate launcher.** Training starts ``python sandbox/runner.py`` in a new session and
  never forks the untrusted code itself: the code's parent is not training, and it shares no
  process group with it. No ``preexec_fn`` runs in the (threaded) training process.
- **PID namespace** (root, or an unprivileged user namespace): the code runs under a PID-1 init
  of its own; on timeout the launcher SIGKILLs that init and the kernel kills every process of the
  namespace, including ones that escaped with ``setsid``. Training's PIDs do not exist in there.
  Without it, the init and the launcher are child subreapers and kill what is left.
- **Mount and network namespaces**: private tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` and
  the working directory (all vanish with the namespace), a fresh ``/proc``; a network namespace
  with no interface up. In-process, ``socket.socket`` is also patched to raise.
- **Dropped uid** (when run as root): an unused uid (random, checked against the passwd/group
  databases; ``nobody`` as fallback; never root). It cannot signal training or write root-owned
  files, and ``RLIMIT_NPROC`` (not enforced for root) bounds fork bombs; stray processes are
  killed by a helper doing ``kill(-1, SIGKILL)`` as that uid. If the interpreter lives where that
  uid cannot read (e.g. ``/root``), the standard library is bind-mounted readable (or, without a
  mount namespace, common modules are imported before the drop).
- **Resource limits** (``setrlimit``): address space, CPU time, file size (stdout included),
  processes, open files; no core dumps. A wall-clock deadline in the launcher, another in the
  parent, and a per-step ``setitimer`` inside the child.
- **Scrubbed environment** (``PATH``, ``HOME`` = the working directory, ``PYTHONHASHSEED``,
  ``LANG``), interpreter flags ``-s -S -P``: ``python -I`` minus ``-E`` so that ``PYTHONHASHSEED``
  keeps results reproducible (with a scrubbed environment ``-E`` has nothing else to ignore).
- **Result channel**: per-step JSON records go through a dedicated pipe (not stdout), carry a
  random nonce and must arrive in order; anything else marks the run ``tampered`` (nothing
  passes). ``sys.exit`` is an error; ``os._exit`` leaves steps unreported, hence not passed.
- **Setup handshake**: the init and the worker report over a pipe that is closed before any
  untrusted code runs; if the isolation could not be set up, :class:`SandboxError` is raised
  instead of silently scoring zero.

Limits (best effort): the harness shares its process with the code, so a program that
deliberately introspects it (``gc``, frames, closures) could forge records, and a function may
return an object whose ``__eq__`` is always true. Without root and without user namespaces only
the launcher, process-group, time and rlimit layers remain, and the code runs as the training
user.
"""

from __future__ import annotations

import dataclasses
import grp
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from comlrl_lightning.sandbox.harness import parse_records

_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
_UID_RANGE = (2_000_000_000, 2_100_000_000)
STATUSES = ("passed", "failed", "error", "timeout", "killed")


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not the code's fault): e.g. the launcher failed to start."""


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
        namespaces: use PID/mount/network namespaces where the OS allows it.
        drop_privileges: when running as root, run the code as an unused uid.
        uid: that uid; ``None`` picks a random unused one per run (falls back to ``nobody``).
        hash_seed: ``PYTHONHASHSEED`` of the child (``None``: random).
        max_message_chars: bound on :attr:`SandboxResult.message`.
        max_output_chars: bound on the captured stdout/stderr tails.
        startup_grace_s: extra seconds the parent waits for the launcher beyond ``timeout_s``
            before killing its whole process group.

    Raises:
        ValueError: a limit is not positive, or ``uid`` is root.
    """

    timeout_s: float = 5.0
    test_timeout_s: float = 2.0
    cpu_time_s: int | None = None
    memory_mb: int = 1024
    file_size_mb: int = 16
    disk_mb: int = 64
    max_processes: int = 32
    namespaces: bool = True
    drop_privileges: bool = True
    uid: int | None = None
    hash_seed: int | None = 0
    max_message_chars: int = 400
    max_output_chars: int = 4000
    startup_grace_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("timeout_s", "test_timeout_s", "memory_mb", "file_size_mb", "disk_mb", "max_processes",
                     "max_message_chars", "max_output_chars"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"SandboxConfig.{name}: got {value!r}; must be a positive number")
        if self.startup_grace_s < 0:
            raise ValueError(f"SandboxConfig.startup_grace_s: got {self.startup_grace_s!r}; must be >= 0")
        if self.uid is not None and not 0 < self.uid < 2**32 - 1:
            raise ValueError(f"SandboxConfig.uid: got {self.uid!r}; must be a non-root uid (or None)")
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

    Args:
        program: untrusted source code (e.g. a generated function).
        tests: statements, each run on its own with its own timeout in the program's namespace,
            e.g. ``"assert add(1, 2) == 3"``. Multi-statement strings are fine.
        setup: trusted scaffolding run after the program, before the tests (helper imports,
            ``def check(candidate): ...``); if it fails, the program counts as failed to load.
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
    base = tempfile.mkdtemp(prefix="comlrl_sbx_")
    t0 = time.monotonic()
    try:
        os.chmod(base, 0o711)
        workdir = os.path.join(base, "work")
        os.mkdir(workdir, 0o700)
        uid, unique = _pick_uid(cfg)
        nonce = secrets.token_hex(16)
        job = {
            "program": program, "tests": tests, "setup": setup, "nonce": nonce, "workdir": workdir,
            "timeout_s": cfg.timeout_s, "test_timeout_s": cfg.test_timeout_s,
            "cpu_time_s": int(cfg.cpu_time_s or int(cfg.timeout_s + 0.999) + 1),
            "memory_mb": cfg.memory_mb, "file_size_mb": cfg.file_size_mb, "disk_mb": cfg.disk_mb,
            "max_processes": cfg.max_processes, "namespaces": cfg.namespaces,
            "uid": uid, "gid": uid, "unique_uid": unique, "max_message_chars": cfg.max_message_chars,
        }
        job_path = os.path.join(base, "job.json")
        with open(os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump(job, f)
        killed_by_parent, launcher_rc = _launch(job_path, base, workdir, cfg, uid, unique)
        report = _build_report(base, cfg, nonce, len(tests), killed_by_parent, launcher_rc)
        report.sandbox_uid = uid
        report.duration_s = time.monotonic() - t0
        report.program.duration_s = report.duration_s
        return report
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_code(program: str, *, config: SandboxConfig | None = None, **overrides: object) -> SandboxResult:
    """Run ``program`` alone in the sandbox; its result (``passed`` if it ran without exception)."""
    return run_tests(program, (), config=config, **overrides).program


def _pick_uid(cfg: SandboxConfig) -> tuple[int | None, bool]:
    """(uid to run as, whether it is unused by anyone else); ``(None, False)`` without root."""
    if not cfg.drop_privileges or os.geteuid() != 0:
        return None, False
    if cfg.uid is not None:
        return cfg.uid, False
    for _ in range(20):
        uid = secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0]
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)
            continue
        except KeyError:
            return uid, True
    return 65534, False


def _launch(
    job_path: str, base: str, workdir: str, cfg: SandboxConfig, uid: int | None, unique: bool
) -> tuple[bool, int]:
    """Start the launcher and wait for it: (whether the parent had to kill it, its return code)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"}
    if cfg.hash_seed is not None:
        env["PYTHONHASHSEED"] = str(cfg.hash_seed)
    flags = ["-s", "-S"] + (["-P"] if sys.version_info >= (3, 11) else [])
    with open(os.path.join(base, "stdout"), "wb") as out, open(os.path.join(base, "stderr"), "wb") as err:
        try:
            proc = subprocess.Popen(
                [sys.executable, *flags, _RUNNER, job_path], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                env=env, cwd=workdir, start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            raise SandboxError(f"could not start the sandbox launcher: {exc}") from exc
        try:
            return False, proc.wait(timeout=cfg.timeout_s + cfg.startup_grace_s)
        except subprocess.TimeoutExpired:
            _kill_stuck(proc, base, uid if unique else None)
            return True, proc.returncode


def _kill_stuck(proc: subprocess.Popen, base: str, unique_uid: int | None) -> None:
    """Fallback when the launcher overran: kill its namespace init, its process group, the uid."""
    try:
        with open(os.path.join(base, "init.pid")) as f:
            os.kill(int(f.read()), signal.SIGKILL)  # still the launcher's unreaped child
    except (OSError, ValueError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()
    if unique_uid is not None:  # in a fresh process: forking the (threaded) training process is unsafe
        quiet = subprocess.DEVNULL
        cmd = [sys.executable, "-s", "-S", _RUNNER, "--kill-uid", str(unique_uid)]
        subprocess.run(cmd, env={}, timeout=30, stdin=quiet, stdout=quiet, stderr=quiet, check=False)


def _tail(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4 * limit))
            return f.read().decode("utf-8", "replace")[-limit:]
    except OSError:
        return ""


def _build_report(
    base: str, cfg: SandboxConfig, nonce: str, num_tests: int, killed_by_parent: bool, launcher_rc: int
) -> TestReport:
    lim = cfg.max_message_chars
    stdout, stderr = _tail(os.path.join(base, "stdout"), cfg.max_output_chars), _tail(
        os.path.join(base, "stderr"), cfg.max_output_chars
    )
    try:
        with open(os.path.join(base, "result.json")) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = None
    if res is not None and res.get("infra_error"):
        raise SandboxError(f"sandbox launcher failed: {res['infra_error']}")
    if res is None and launcher_rc >= 0 and not killed_by_parent:  # it always writes a result unless killed
        raise SandboxError(f"sandbox launcher exited with code {launcher_rc} without a result: "
                           f"{stderr[-1500:]}")
    if res is None:  # launcher killed (by the parent's deadline, or by the code when not isolated)
        if killed_by_parent:
            end = SandboxResult("timeout", "Timeout", f"run exceeded {cfg.timeout_s:g} s (launcher killed)")
        else:
            end = SandboxResult("killed", "LauncherDied", f"sandbox launcher died: {stderr[-lim:]}"[:lim])
        return TestReport(end, [dataclasses.replace(end) for _ in range(num_tests)], stdout, stderr)
    setup_failed = not res["init_ready"] or (not res["worker_ready"] and res["status"] is not None)
    if setup_failed and not res["timed_out"]:
        # setup failed before any untrusted code ran (the status pipe is closed before it does)
        raise SandboxError(f"sandbox setup failed ({res.get('isolation')}); stderr: {stderr[-1500:]}")
    st = res.get("status") or {}
    returncode = st.get("code") if st.get("kind") == "exited" else (
        -st["signal"] if st.get("kind") == "signaled" else None)
    if res["timed_out"]:
        end = SandboxResult("timeout", "Timeout", f"run exceeded {cfg.timeout_s:g} s wall clock", 0.0, None)
    elif st.get("kind") == "signaled":
        name = _signame(st["signal"])
        end = SandboxResult("killed", name, f"killed by {name} (resource limit or signal)", 0.0, returncode)
    elif st.get("kind") == "exited":
        end = SandboxResult("error", "EarlyExit", f"exited with code {returncode} before reporting", 0.0,
                            returncode)
    else:  # the namespace init died without reporting (killed from inside when not isolated)
        end = SandboxResult("killed", "SandboxKilled", "the sandbox's init process was killed", 0.0, None)
    try:
        program_rec, test_recs, isolation = parse_records(res["records"], nonce, num_tests, STATUSES)
        tampered = bool(res["overflow"])
    except ValueError:
        program_rec, test_recs, isolation, tampered = None, [], [], True
    isolation = res["isolation"] + isolation
    program = _result(program_rec, lim) if program_rec else None
    tests = [_result(r, lim) for r in test_recs]
    if tampered:
        bad = SandboxResult("error", "ResultTampering", "forged or malformed result records", 0.0, returncode)
        return TestReport(bad, [dataclasses.replace(bad) for _ in range(num_tests)], stdout, stderr,
                          isolation=isolation, tampered=True)
    if program is None:
        program = end
    program.returncode = returncode
    if not program.passed:
        note = f"program failed to load: {program.message}"[:lim]
        tests = [SandboxResult(program.status, program.error_type, note, 0.0, returncode)
                 for _ in range(num_tests)]
    else:
        for t in tests:
            t.returncode = returncode
        tests += [dataclasses.replace(end) for _ in range(num_tests - len(tests))]
    return TestReport(program, tests, stdout, stderr, isolation=isolation)


def _result(rec: dict, lim: int) -> SandboxResult:
    err = rec.get("e")
    return SandboxResult(rec["s"], None if err is None else str(err)[:100], str(rec.get("m", ""))[:lim],
                         float(rec.get("d") or 0.0))


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


@dataclass
class TestJob:
    """One unit of work for :class:`SandboxPool`: a program, its tests and trusted setup."""

    __test__ = False

    program: str
    tests: Sequence[str] = ()
    setup: str = ""


class SandboxPool:
    """Runs many sandboxed jobs in parallel (threads driving launcher subprocesses).

    Args:
        max_workers: concurrent sandboxes; default ``os.cpu_count()``.
        config: the :class:`SandboxConfig` for every job.

    Use as a context manager or call :meth:`close`; the thread pool is created on first use.
    """

    def __init__(self, max_workers: int | None = None, config: SandboxConfig | None = None) -> None:
        self.max_workers = max_workers or os.cpu_count() or 1
        if self.max_workers < 1:
            raise ValueError(f"SandboxPool.max_workers: got {max_workers!r}; must be >= 1")
        self.config = config or SandboxConfig()
        self._executor: ThreadPoolExecutor | None = None

    def run(self, jobs: Iterable[TestJob | tuple[str, Sequence[str]]]) -> list[TestReport]:
        """Run ``jobs`` (``TestJob`` or ``(program, tests)``); reports in the order of ``jobs``."""
        jobs = [j if isinstance(j, TestJob) else TestJob(*j) for j in jobs]
        if not jobs:
            return []
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="sandbox")
        futures = [self._executor.submit(run_tests, j.program, j.tests, setup=j.setup, config=self.config)
                   for j in jobs]
        return [f.result() for f in futures]

    def map(
        self,
        programs: Iterable[str],
        tests: Iterable[Sequence[str]] | None = None,
        setups: Iterable[str] | None = None,
    ) -> list[TestReport]:
        """Like ``map(run_tests, programs, tests, setups)``, in parallel; results in input order."""
        programs = list(programs)
        tests = list(tests) if tests is not None else [()] * len(programs)
        setups = list(setups) if setups is not None else [""] * len(programs)
        if not len(programs) == len(tests) == len(setups):
            raise ValueError(f"SandboxPool.map: {len(programs)} programs, {len(tests)} test lists, "
                             f"{len(setups)} setups; the lengths must match")
        return self.run(TestJob(p, t, s) for p, t, s in zip(programs, tests, setups))

    def close(self) -> None:
        """Shut the worker threads down (waits for running jobs)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_executor"] = None
        return state
