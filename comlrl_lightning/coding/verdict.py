"""A program's judged test results on one problem: record (cached), run in the sandbox, judge.

See :mod:`comlrl_lightning.coding.judge` for the design. :func:`evaluate` returns the same
:class:`~comlrl_lightning.coding.sandbox.api.TestReport` the rewards and the feedback read, but every
test status in it was decided by the trusted judge from the candidate's plain outputs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from comlrl_lightning.coding.judge import Judge
from comlrl_lightning.coding.recorder import Recording, recording_for
from comlrl_lightning.coding.sandbox.api import (
    CallsReport,
    SandboxConfig,
    SandboxResult,
    TestReport,
    run_calls,
)
from comlrl_lightning.coding.sandbox.split import run_split
from comlrl_lightning.coding.standin import substitute


@dataclass
class JudgedReport(TestReport):
    """A :class:`TestReport` plus the candidate's plain outputs, one per recorded call (``{"o":
    value}``, ``{"x": exception type}``, ``{"t": category}`` or ``None``), for the cooperation
    counterfactual (:mod:`comlrl_lightning.coding.standin`), each call's duration, and in a
    split run the helper's calls made after main loaded (arguments and real outputs), how many ran
    out of time, and how many times the broker was told the entry point's calls begin (``entries``:
    1 unless main forged it, :data:`comlrl_lightning.coding.sandbox.channel.ENTRY`)."""

    __test__ = False
    outputs: list[dict | None] = field(default_factory=list)
    durations: list[float | None] = field(default_factory=list)
    aux_calls: list[tuple[list, dict, dict]] = field(default_factory=list)
    helper_timeouts: int = 0
    entries: int = 0


def evaluate(
    row: dict[str, Any],
    program: str,
    judge: Judge,
    config: SandboxConfig,
    *,
    main: str = "",
    protected: Sequence[str] = (),
    helper: str | None = None,
    kind: str = "real",
    budgets: Sequence[float] | None = None,
    answers: Sequence[dict] = (),
) -> JudgedReport:
    """Judged test results of ``program`` (then ``main``, see
    :func:`~comlrl_lightning.coding.sandbox.api.run_calls`) on problem ``row``. With ``helper`` (a
    program defining ``aux``) the run is split (:func:`~comlrl_lightning.coding.sandbox.split.run_split`):
    ``aux`` runs there, and main gets the stand-in ``kind``'s values
    (:func:`~comlrl_lightning.coding.standin.substitute`; ``answers``: the real run's helper
    outputs, for ``reversed``) within per-call ``budgets``.

    Raises:
        SandboxError: the sandbox could not run (not the program's fault).
        JudgeError: the judge failed (not the program's fault).
    """
    rec = recording_for(row)
    keys = rec.keys
    if helper is None:
        calls = run_calls(program, rec.entry_point, keys, main=main, protected=protected, config=config)
    else:
        calls = run_split(
            program,
            helper,
            rec.entry_point,
            keys,
            main=main,
            protected=protected,
            substitute=substitute(kind, answers),
            budgets=budgets,
            # the helper's sandbox starts with main's only when main names `aux` (else on a first
            # call, e.g. through globals()): a main that never calls it costs one sandbox
            eager=re.search(r"\baux\b", main) is not None,
            config=config,
        )
    report = _judged(rec, keys, calls, judge, config.max_message_chars)
    report.outputs, report.durations = list(calls.outputs), list(calls.durations)
    report.aux_calls, report.helper_timeouts = calls.aux_calls, calls.helper_timeouts
    report.entries = calls.entries
    return report


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
            if status == "timeout":  # the judge's category (its own deadline or the harness's)
                tests.append(SandboxResult("timeout", "Timeout", f"{rec.entry_point} timed out"[:lim]))
                continue
            msg = (
                f"{err} raised by {rec.entry_point}"
                if err not in ("CallMismatch", "UnsupportedOutput")
                else str(err)
            )
            tests.append(SandboxResult("error", err, msg[:lim]))
    return JudgedReport(program, tests, **kw)


def _wire(out: dict) -> dict:
    """An output as the judge receives it (re-encoded from the trusted side's decoded value)."""
    from comlrl_lightning.coding.sandbox import plain

    if "o" in out:
        return {"o": plain.encode(out["o"])}
    return {"t": out["t"]} if "t" in out else {"x": str(out["x"])[:100]}


def describe_assert(source: str, entry_point: str) -> str:
    """The (last) ``assert`` line of a test statement, with ``candidate`` shown as the entry point."""
    lines = [line for line in source.splitlines() if line.strip()]
    last = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].lstrip().startswith("assert")), None)
    text = " ".join(x.strip() for x in lines[last:]) if last is not None else lines[-1] if lines else ""
    return re.sub(r"\bcandidate\b", entry_point, text)
