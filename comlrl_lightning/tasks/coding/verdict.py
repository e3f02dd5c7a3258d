"""A program's judged test results on one problem: record (cached), run in the sandbox, judge.

See :mod:`comlrl_lightning.tasks.coding.judge` for the design. :func:`evaluate` returns the same
:class:`~comlrl_lightning.sandbox.api.TestReport` the rewards and the feedback read, but every
test status in it was decided by the trusted judge from the candidate's plain outputs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from comlrl_lightning.sandbox.api import CallsReport, SandboxConfig, SandboxResult, TestReport, run_calls
from comlrl_lightning.tasks.coding.judge import Judge
from comlrl_lightning.tasks.coding.recorder import Recording, recording_for


@dataclass
class JudgedReport(TestReport):
    """A :class:`TestReport` plus what the helper did (only with a ``probe``; read by the
    cooperation bonus, see :class:`~comlrl_lightning.tasks.coding.reward.CooperativeCodeReward`).

    Attributes:
        helper_varies: in the calls of the entry point that called the helper, its outputs were
            not all equal (a constant helper cannot be what makes a test pass).
        helper_mirrors: on every input where both the entry point and the helper called alone
            returned (at least one), they returned the same value: the entry point behaves as a
            wrapper of the helper.
    """

    __test__ = False
    helper_varies: bool = False
    helper_mirrors: bool = False


def evaluate(
    row: dict[str, Any],
    program: str,
    judge: Judge,
    config: SandboxConfig,
    *,
    main: str = "",
    protected: Sequence[str] = (),
    probe: str = "",
) -> JudgedReport:
    """Judged test results of ``program`` (then ``main``, see
    :func:`~comlrl_lightning.sandbox.api.run_calls`) on problem ``row``.

    Raises:
        SandboxError: the sandbox could not run (not the program's fault).
        JudgeError: the judge failed (not the program's fault).
    """
    rec = recording_for(row)
    keys = rec.keys
    calls = run_calls(
        program, rec.entry_point, keys, main=main, protected=protected, probe=probe, config=config
    )
    report = _judged(rec, keys, calls, judge, config.max_message_chars)
    if probe:
        seen = {x for a in calls.helper_seen if a for x in a}
        report.helper_varies = len(seen) > 1
        both = [
            (o["o"], d["o"])
            for o, d in zip(calls.outputs, calls.helper_direct)
            if o is not None and d is not None and "o" in o and "o" in d
        ]
        report.helper_mirrors = bool(both) and all(_same(a, b) for a, b in both)
    return report


def _same(a: object, b: object) -> bool:
    from comlrl_lightning.sandbox import plain

    return json.dumps(plain.encode(a), sort_keys=True) == json.dumps(plain.encode(b), sort_keys=True)


def _judged(rec: Recording, keys: list[str], calls: CallsReport, judge: Judge, lim: int) -> JudgedReport:
    kw = {
        "stdout": calls.stdout,
        "stderr": calls.stderr,
        "duration_s": calls.duration_s,
        "isolation": calls.isolation,
        "missing": calls.missing,
    }
    program = calls.program
    if not program.passed:
        note = f"program failed to load: {program.error_type}: {program.message}"[:lim]
        tests = [SandboxResult(program.status, program.error_type, note) for _ in rec.tests]
        return JudgedReport(program, tests, **kw)
    outs = calls.outputs
    outputs = {k: _wire(o) for k, o in zip(keys, outs) if o is not None}
    results = judge.judge(rec.setup, rec.tests, outputs, rec.seed, rec.entry_point)
    tests = []
    for source, (status, err), call_keys in zip(rec.tests, results, rec.calls):
        missing = [k for k in call_keys if k not in outputs]
        if status != "passed" and missing:  # no output for a call: say how the run ended
            end = calls.end
            tests.append(SandboxResult(end.status, end.error_type, end.message[:lim]))
        elif status == "failed":
            tests.append(
                SandboxResult("failed", "AssertionError", describe_assert(source, rec.entry_point)[:lim])
            )
        elif status == "passed":
            tests.append(SandboxResult("passed"))
        else:
            msg = f"{err} raised by {rec.entry_point}" if err not in ("CallMismatch", "Timeout") else str(err)
            tests.append(SandboxResult("timeout" if err == "Timeout" else "error", err, msg[:lim]))
    return JudgedReport(program, tests, **kw)


def _wire(out: dict) -> dict:
    """An output as the judge receives it (re-encoded from the trusted side's decoded value)."""
    from comlrl_lightning.sandbox import plain

    return {"o": plain.encode(out["o"])} if "o" in out else {"x": str(out["x"])[:100]}


def describe_assert(source: str, entry_point: str) -> str:
    """The (last) ``assert`` line of a test statement, with ``candidate`` shown as the entry point."""
    lines = [line for line in source.splitlines() if line.strip()]
    last = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].lstrip().startswith("assert")), None)
    text = " ".join(x.strip() for x in lines[last:]) if last is not None else lines[-1] if lines else ""
    return re.sub(r"\bcandidate\b", entry_point, text)
