"""The calls mode of the sandbox: untrusted code called on given inputs, plain outputs back.

See :mod:`comlrl_lightning.coding.sandbox.api` (why verdicts are not decided in the sandbox) and
:mod:`comlrl_lightning.coding.judge` (who decides them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from comlrl_lightning.coding.sandbox import plain
from comlrl_lightning.coding.sandbox.launch import RawRun, SandboxError, launch
from comlrl_lightning.coding.sandbox.results import SandboxConfig, SandboxResult, end_result, record_result


@dataclass
class CallsReport:
    """What :func:`run_calls` read back.

    Attributes:
        program: result of loading the program (``passed``: the entry point exists).
        outputs: one per call: ``{"o": value}`` (a plain value, decoded by the
            trusted side), ``{"x": exception type name}`` (the candidate raised), ``{"t": "timeout" |
            "unsupported"}`` (the harness's categories: a call over its time, an output that is
            not plain data) or ``None`` (no output: the process died, exited or ran out of time first).
        end: how the run ended (explains ``None`` outputs).
        stdout, stderr: bounded tails of the child's output.
        duration_s: wall-clock seconds of the whole run.
        isolation, missing: layers applied / not applied (see :class:`TestReport`).
        durations: seconds each call took (``None`` where it gave no output).
        aux_calls, helper_timeouts: a split run's calls of the helper (arguments, keyword
            arguments, the helper's real output) and how many ran out of time
            (:mod:`comlrl_lightning.coding.sandbox.split`); ``entries``: how many times the split run's
            broker was told the entry point's calls begin (1 unless main forged it).
    """

    program: SandboxResult
    outputs: list[dict | None]
    end: SandboxResult
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    isolation: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    durations: list[float | None] = field(default_factory=list)
    aux_calls: list[tuple[list, dict, dict]] = field(default_factory=list)
    helper_timeouts: int = 0
    entries: int = 0


def run_calls(
    program: str,
    entry_point: str,
    calls: Sequence[str],
    *,
    main: str = "",
    protected: Sequence[str] = (),
    config: SandboxConfig | None = None,
    **overrides: object,
) -> CallsReport:
    """Load untrusted ``program`` (then ``main``) and call ``entry_point`` on each input.

    Args:
        program: untrusted source loaded first (e.g. the prompt's preamble and the helper).
        entry_point: the function to call.
        calls: inputs, each ``plain.dumps([args, kwargs])``.
        main: untrusted source loaded after ``program``; afterwards the names in ``protected``
            are restored to what ``program`` bound (or removed), so ``main`` cannot replace them.
        config, **overrides: limits, as for :func:`run_tests` (``test_timeout_s`` is per call).

    Returns:
        A :class:`CallsReport` with ``len(calls)`` outputs.

    Raises:
        SandboxError: the sandbox could not be started or crashed (not the code's fault).
    """
    cfg = (config or SandboxConfig()).replace(**overrides)
    fields = {
        "mode": "calls",
        "program": program,
        "main": main,
        "protected": list(protected),
        "entry_point": entry_point,
        "calls": list(calls),
    }
    return collect_calls(launch(fields, cfg), cfg, len(calls))


def collect_calls(raw: RawRun, cfg: SandboxConfig, num_calls: int) -> CallsReport:
    """The :class:`CallsReport` of a ``calls``-mode run from what its launcher left."""
    end = end_result(raw, cfg)
    outputs: list[dict | None] = [None] * num_calls
    durations: list[float | None] = [None] * num_calls
    program_res, iso = None, []
    for line in raw.res["records"]:
        rec = _json_line(line)
        if not isinstance(rec, dict):
            continue
        # the fallback's init and worker report their layers first; under bubblewrap the launcher
        # reports them all, so an `iso` record can only come from the candidate's process: refused
        if (
            rec.get("k") == "iso"
            and not raw.bwrap
            and program_res is None
            and len(iso) < 2
            and isinstance(rec.get("items"), list)
        ):
            iso.append(rec["items"])
        if rec.get("k") == "program" and program_res is None:
            program_res = record_result(rec, cfg.max_message_chars)
        i = rec.get("i")
        if rec.get("k") is None and type(i) is int and 0 <= i < num_calls and outputs[i] is None:
            outputs[i] = _output(rec)
            d = rec.get("d")
            durations[i] = float(d) if type(d) in (int, float) and 0 <= d < 1e6 else None
    if program_res is None:
        program_res = replace(end)
    applied, missing = raw.layers([x for items in iso for x in items])
    return CallsReport(
        program_res, outputs, end, raw.stdout, raw.stderr, raw.duration_s, applied, missing, durations
    )


def run_record(
    program: str,
    setup: str,
    tests: Sequence[str],
    entry_point: str,
    *,
    seed: int = 0,
    config: SandboxConfig | None = None,
    **overrides: object,
) -> tuple[SandboxResult, list[dict]]:
    """Run *trusted* ``tests`` against *trusted* ``program`` with the entry point wrapped in a
    recorder (after ``random.seed(seed)`` per test), in a sandbox.

    Returns:
        ``(program result, one dict per test: {"s": status, "e": error type, "calls":
        [[plain.dumps([args, kwargs]), {"o": encoded output} | {"x": exception type}], ...]})``.

    Raises:
        SandboxError: the sandbox failed, or it did not report every test.
    """
    cfg = (config or SandboxConfig()).replace(**overrides)
    fields = {
        "mode": "record",
        "program": program,
        "setup": setup,
        "tests": list(tests),
        "entry_point": entry_point,
        "seed": seed,
    }
    raw = launch(fields, cfg)
    recs = [r for r in map(_json_line, raw.res["records"]) if isinstance(r, dict)]
    program_res = next(
        (record_result(r, cfg.max_message_chars) for r in recs if r.get("k") == "program"),
        end_result(raw, cfg),
    )
    tests_out = [r for r in recs if r.get("k") == "test"]
    if program_res.passed and len(tests_out) != len(tests):
        raise SandboxError(
            f"recording {entry_point}: {len(tests_out)} of {len(tests)} tests reported "
            f"({end_result(raw, cfg).message}); stderr: {raw.stderr[-500:]}"
        )
    return program_res, tests_out


def _json_line(line: str) -> object:
    try:
        return plain.json.loads(line)
    except (ValueError, RecursionError, MemoryError):
        return None


RESERVED_NAMES = frozenset({"Timeout", "UnsupportedOutput", "CallMismatch", "JudgeTimeout"})
"""Names of the harness's and the judge's own categories: a candidate exception of that name is
reported as ``"Exception"``, so no class name can make a failure read as one of them."""


def _output(rec: dict) -> dict:
    if "o" in rec:
        try:
            return {"o": plain.decode(rec["o"])}
        except (plain.PlainDataError, RecursionError):
            return {"t": "unsupported"}
    if rec.get("t") in ("timeout", "unsupported"):
        return {"t": rec["t"]}
    name = rec.get("x")
    name = name[:100] if type(name) is str else "Exception"
    return {"x": "Exception" if name in RESERVED_NAMES else name}
