"""Run untrusted Python code (generated programs) without risk to training, and without trusting it.

Generated code may loop forever, fork-bomb, allocate without bound, kill its parent, write
anywhere, exit early, introspect its own process or print a fake result. None of that may stop,
slow (beyond its timeout) or corrupt training, reach the host, or raise its own score.

**Verdicts are not decided here.** :func:`~comlrl_lightning.coding.sandbox.calls.run_calls`, what rewards use, loads the program and
calls its entry point on the given *inputs*; the sandboxed process returns *outputs* as plain data
(:mod:`comlrl_lightning.coding.sandbox.plain`: exact builtin types, size-capped; anything else is an
``UnsupportedOutput`` failure) and never holds an expected value, a test, a nonce or a verdict, so
nothing it can reach is worth forging. A trusted judge compares
(:mod:`comlrl_lightning.coding.judge`). :func:`~comlrl_lightning.coding.sandbox.calls.run_record` runs *trusted* code (a reference
solution) to record the inputs its tests use. :func:`run_tests` runs test statements inside the
sandboxed process and reports their statuses: its verdict can be forged by the program, so it is
for containment checks and trusted code only.

**Containment** (:mod:`.isolation` for the layers, :mod:`.runner` for the launcher): training
starts ``runner.py`` in a new session and never forks untrusted code; the launcher stages a
read-only view, creates a cgroup per run (memory counting shared memory and memfd, pids), drops
to an unused uid with a fresh session keyring and rlimits (address space, CPU, file size,
processes, open files, no core dumps), and execs ``bwrap`` (user, PID, mount, network, IPC, UTS,
cgroup namespaces; only the interpreter, its standard library and the harness visible, no
site-packages; private ``/dev`` without ptys; one scratch tmpfs writable; a seccomp filter against new
namespaces, mounts, keyrings, io_uring, ptrace, SysV/POSIX IPC, inotify and epoll). Wall-clock deadlines in the
harness (per call), the launcher (SIGKILL to the namespace's PID 1, then the cgroup) and the parent
(backstop). Where bubblewrap cannot run, the fallback launcher (:mod:`.nsinit`) applies what the OS
allows; every report lists the layers applied (:attr:`TestReport.isolation`) and missing
(:attr:`TestReport.missing`), and the missing ones are logged once per process.
"""

from __future__ import annotations

from comlrl_lightning.coding.sandbox.calls import CallsReport, run_calls, run_record
from comlrl_lightning.coding.sandbox.launch import SandboxError
from comlrl_lightning.coding.sandbox.pool import SandboxPool, TestJob
from comlrl_lightning.coding.sandbox.results import (
    BACKENDS,
    STATUSES,
    SandboxConfig,
    SandboxResult,
    TestReport,
)
from comlrl_lightning.coding.sandbox.tests_mode import run_tests

__all__ = [
    "BACKENDS",
    "STATUSES",
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
