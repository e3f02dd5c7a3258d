"""Isolated execution of untrusted (generated) Python code: see :mod:`comlrl_lightning.sandbox.api`."""

from comlrl_lightning.sandbox.api import (
    SandboxConfig,
    SandboxError,
    SandboxPool,
    SandboxResult,
    TestJob,
    TestReport,
    run_tests,
)

__all__ = ["SandboxConfig", "SandboxError", "SandboxPool", "SandboxResult", "TestJob", "TestReport", "run_tests"]
