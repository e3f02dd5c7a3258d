"""Isolated execution of untrusted (generated) Python code: see :mod:`comlrl_lightning.coding.sandbox.api`."""

from comlrl_lightning.coding.sandbox.api import (
    CallsReport,
    SandboxConfig,
    SandboxError,
    SandboxPool,
    SandboxResult,
    TestJob,
    TestReport,
    run_calls,
    run_record,
    run_tests,
)

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
