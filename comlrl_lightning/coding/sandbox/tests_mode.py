"""The tests mode of the sandbox: test statements run *inside* the sandboxed process (their verdict
can be forged by the program: containment checks and trusted code only)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from comlrl_lightning.coding.sandbox.harness import parse_records
from comlrl_lightning.coding.sandbox.launch import RawRun, launch
from comlrl_lightning.coding.sandbox.results import (
    STATUSES,
    SandboxConfig,
    SandboxResult,
    TestReport,
    end_result,
    record_result,
)


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
    return tests_report(raw, cfg, nonce, len(tests))


def tests_report(raw: RawRun, cfg: SandboxConfig, nonce: str, num_tests: int) -> TestReport:
    lim, end = cfg.max_message_chars, end_result(raw, cfg)
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
    program = record_result(program_rec, lim) if program_rec else dataclasses.replace(end)
    program.returncode = returncode
    tests = [record_result(r, lim) for r in test_recs]
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
