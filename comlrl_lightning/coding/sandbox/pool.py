"""Many sandboxed :func:`~comlrl_lightning.coding.sandbox.run_tests` jobs in parallel (threads driving
launcher subprocesses)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from comlrl_lightning.coding.sandbox.results import SandboxConfig, TestReport
from comlrl_lightning.coding.sandbox.tests_mode import run_tests


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
        futures = [
            self._executor.submit(run_tests, j.program, j.tests, setup=j.setup, config=self.config)
            for j in jobs
        ]
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
            raise ValueError(
                f"SandboxPool.map: {len(programs)} programs, {len(tests)} test lists, "
                f"{len(setups)} setups; the lengths must match"
            )
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
