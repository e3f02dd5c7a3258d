"""The in-sandbox harness: runs untrusted code and reports what it did, one JSON line per step.

Standard library only; loaded by path in the sandboxed worker after the isolation is in place
(the bubblewrap path starts it as ``python harness.py JOB_FD RESULT_FD READY_FD``, the fallback
:mod:`comlrl_lightning.coding.sandbox.runner` calls :func:`dispatch`). Three modes (``job["mode"]``):

- ``"calls"`` (:func:`run_calls`, what rewards use): load the program, then call its entry point
  on each given input and write back the *outputs* as plain data
  (:mod:`comlrl_lightning.coding.sandbox.plain`): ``{"v": 0, "i": call, "o": output}`` or
  ``{"v", "i", "x": exception type}``. No expected value, test or verdict is ever in this process,
  so nothing it can reach is worth forging; the trusted judge decides.
- ``"record"`` (:func:`run_record`, trusted code only): run each test with ``candidate`` wrapped
  in a recorder, for the judge to replay (:mod:`comlrl_lightning.coding.judge`).
- ``"tests"`` (:func:`run`): run test statements in the program's namespace and report statuses
  ``{"k": "program"|"test"|"done", "i", "s", "e", "m", "d", "n": nonce}``, validated by
  :func:`parse_records`. The verdict is decided *inside* the sandboxed process here, so a hostile
  program can forge it: use it for containment and trusted code, never for a reward.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
import types

_spec = importlib.util.spec_from_file_location(
    "sandbox_plain", os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain.py")
)
plain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plain)
_spec = importlib.util.spec_from_file_location(
    "sandbox_channel", os.path.join(os.path.dirname(os.path.abspath(__file__)), "channel.py")
)
channel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(channel)


def _block_sockets() -> None:
    import socket

    class _NoNetwork(socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the sandbox")

    socket.socket = _NoNetwork
    socket.SocketType = _NoNetwork


class _StepTimeout(BaseException):
    """Raised by SIGALRM when a step exceeds its per-step timeout."""


def run(job: dict, wfd: int) -> None:
    """Run program, setup and each test, one record per step to ``wfd``, then ``os._exit(0)``.

    Blocks ``socket`` first. Everything needed after the untrusted code has started is held in
    locals (the code can rebind builtins and module globals). Each step has a ``setitimer``
    timeout (``job["test_timeout_s"]``); ``SystemExit`` is an error, never a pass.
    """
    _block_sockets()
    write, dumps, mono, setitimer, exc_only = (
        os.write,
        json.dumps,
        time.monotonic,
        signal.setitimer,
        (traceback.format_exception_only),
    )
    _exec, _compile, _isinstance, _str, _type, _len = exec, compile, isinstance, str, type, len
    nonce, limit, step_timeout = job.pop("nonce"), job["max_message_chars"], job["test_timeout_s"]
    program_path = os.path.join(job["workdir"], "program.py")

    def on_alarm(signum, frame):
        raise _StepTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    module = types.ModuleType("__sandbox__")
    sys.modules["__sandbox__"] = module
    ns = module.__dict__
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    try:
        with open(program_path, "w") as f:
            f.write(job["program"])
    except OSError:
        pass

    def emit(**rec):
        rec["n"] = nonce
        write(wfd, (dumps(rec) + "\n").encode())

    sources = {program_path: job["program"], "<setup>": job["setup"]}

    def describe(err: BaseException) -> str:
        if _isinstance(err, SyntaxError):
            text = (err.text or "").strip()
            return f"SyntaxError: {err.msg} (line {err.lineno}: {text})"[:limit]
        where = None  # innermost frame of sandboxed source
        for frame, ln in traceback.walk_tb(err.__traceback__):
            if frame.f_code.co_filename in sources:
                where = (frame.f_code.co_filename, ln)
        if _isinstance(err, AssertionError) and where is not None:
            msg = _str(err)
            return (_statement_at(sources[where[0]], where[1]) + (f"  # {msg}" if msg else ""))[:limit]
        head = exc_only(_type(err), err)[-1].strip()
        if where is not None:
            name = "program" if where[0] == program_path else where[0]
            head += f" ({name} line {where[1]}: {_line(sources[where[0]], where[1])})"
        return head[:limit]

    def step(source: str, filename: str) -> dict:
        t = mono()
        sources[filename] = source
        try:
            code = _compile(source, filename, "exec")
        except (SyntaxError, ValueError) as err:
            return {"s": "error", "e": _type(err).__name__, "m": describe(err), "d": 0.0}
        try:
            try:
                setitimer(signal.ITIMER_REAL, step_timeout)
                _exec(code, ns)
            finally:
                setitimer(signal.ITIMER_REAL, 0)
            rec = {"s": "passed", "e": None, "m": ""}
        except _StepTimeout:
            rec = {"s": "timeout", "e": "Timeout", "m": f"step exceeded {step_timeout:g} s"}
        except AssertionError as err:
            rec = {"s": "failed", "e": "AssertionError", "m": describe(err)}
        except SystemExit as err:
            rec = {"s": "error", "e": "SystemExit", "m": f"SystemExit({err.code!r}) raised"[:limit]}
        except BaseException as err:  # noqa: BLE001 - every failure is a result
            rec = {"s": "error", "e": _type(err).__name__, "m": describe(err)}
        rec["d"] = mono() - t
        return rec

    tests = job["tests"]
    rec = step(job["program"], program_path)
    if rec["s"] == "passed" and job["setup"]:
        rec = step(job["setup"], "<setup>")
        if rec["s"] != "passed":
            rec["m"] = ("test setup failed: " + rec["m"])[:limit]
    emit(k="program", **rec)
    if rec["s"] == "passed":
        for i in range(_len(tests)):
            emit(k="test", i=i, **step(tests[i], f"<test {i}>"))
    emit(k="done")
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(0)


def dispatch(job: dict, wfd: int) -> None:
    """Run ``job`` in the mode it names (``"tests"`` when absent)."""
    modes = {"tests": run, "calls": run_calls, "record": run_record, "serve": _serve}
    modes[job.get("mode", "tests")](job, wfd)


def _serve(job: dict, wfd: int) -> None:
    """The helper's process of a split run (:func:`channel.serve`)."""
    _block_sockets()
    load = lambda ns: _loader(ns, job["test_timeout_s"], job["max_message_chars"])  # noqa: E731
    channel.serve(job, wfd, load, _StepTimeout, _flush_and_exit, plain)


def _loader(ns: dict, step_timeout: float, limit: int):
    """``load(source, filename)``: exec into ``ns`` with a timeout; ``None`` or an error record."""
    _exec, _compile, setitimer, _type, exc_only = (
        exec,
        compile,
        signal.setitimer,
        type,
        (traceback.format_exception_only),
    )

    def on_alarm(signum, frame):
        raise _StepTimeout()

    signal.signal(signal.SIGALRM, on_alarm)

    def load(source: str, filename: str) -> dict | None:
        try:
            setitimer(signal.ITIMER_REAL, step_timeout)
            _exec(_compile(source, filename, "exec"), ns)
            return None
        except _StepTimeout:
            return {"s": "timeout", "e": "Timeout", "m": f"{filename} exceeded {step_timeout:g} s"}
        except BaseException as err:  # noqa: BLE001 - every failure is a result
            return {"s": "error", "e": _type(err).__name__[:100], "m": exc_only(_type(err), err)[-1][:limit]}
        finally:
            setitimer(signal.ITIMER_REAL, 0)

    return load


def run_calls(job: dict, wfd: int) -> None:
    """Load ``program`` then ``main`` (names in ``protected`` are restored to the program's
    objects after ``main``), then call ``entry_point`` on each of ``calls`` (``plain.dumps`` of
    ``[args, kwargs]``). Writes ``program``, one record per call and ``done``, then ``os._exit(0)``.
    With ``job["channel"]`` (a split run, :mod:`comlrl_lightning.coding.sandbox.split`) the name
    ``job["aux"]`` is bound to :func:`channel.stub` before ``main`` loads (and, being protected,
    after), and :data:`channel.ENTRY` is sent once, after ``main`` has loaded and before the
    first call; ``job["budgets"]``: per-call time limits (at most ``test_timeout_s``).
    A call's record is ``{"i", "o": output, "d": seconds}``, ``{"i", "x": exception type}`` (the candidate
    raised) or ``{"i", "t": "timeout" | "unsupported"}`` (this harness's own categories, which no
    exception name can produce)."""
    _block_sockets()
    write, dumps, setitimer, _type, _callable = os.write, json.dumps, signal.setitimer, type, callable
    encode, loads, limit, timeout = plain.encode, plain.loads, job["max_message_chars"], job["test_timeout_s"]
    calls, entry = job["calls"], job["entry_point"]
    module = types.ModuleType("__sandbox__")
    sys.modules["__sandbox__"] = module
    ns = module.__dict__
    load = _loader(ns, timeout, limit)

    def emit(rec: dict) -> None:
        write(wfd, (dumps(rec, separators=(",", ":")) + "\n").encode())

    err = load(job["program"], "<program>")
    if err is None and job.get("channel"):  # a split run: `aux` lives in another sandbox
        ns[job["aux"]] = channel.stub(*job["channel"], plain, _StepTimeout)
    if err is None and job.get("main"):
        saved = {n: ns[n] for n in job.get("protected", ()) if n in ns}
        err = load(job["main"], "<main>")
        for name in job.get("protected", ()):  # the main part may not replace what the prompt/helper define
            if name in saved:
                ns[name] = saved[name]
            else:
                ns.pop(name, None)
    if err is None and not _callable(ns.get(entry)):
        err = {"s": "error", "e": "NameError", "m": f"{entry!r} is not defined"[:limit]}
    emit({"k": "program", **(err or {"s": "passed", "e": None, "m": ""})})
    if err is None and job.get("channel"):  # tells the broker the entry point's calls begin
        try:
            write(job["channel"][1], channel.ENTRY)
        except OSError:  # main closed the channel while loading: no ENTRY, so no bonus
            pass
    fn, budgets, mono = ns.get(entry), job.get("budgets") or [], time.monotonic
    for i in range(len(calls)) if err is None else ():
        t = mono()
        try:
            args, kwargs = loads(calls[i])
            setitimer(signal.ITIMER_REAL, min(timeout, budgets[i]) if i < len(budgets) else timeout)
            try:
                t = mono()
                out = fn(*args, **kwargs)
            finally:
                setitimer(signal.ITIMER_REAL, 0)
            rec = {"i": i, "o": encode(out), "d": round(mono() - t, 4)}
        except _StepTimeout:
            rec = {"i": i, "t": "timeout"}
        except plain.PlainDataError:
            rec = {"i": i, "t": "unsupported"}
        except BaseException as e:  # noqa: BLE001 - the candidate's failure is an output
            rec = {"i": i, "x": str(_type(e).__name__)[:100]}
        try:
            emit(rec)
        except BaseException:  # noqa: BLE001 - e.g. an output too large for the channel
            emit({"i": i, "t": "unsupported"})
    emit({"k": "done"})
    _flush_and_exit()


def run_record(job: dict, wfd: int) -> None:
    """Trusted code only: load ``program`` and ``setup``, then run each of ``tests`` with
    ``candidate`` (and ``entry_point``) bound to a recorder of the entry point, after
    ``random.seed(seed)``. One record per test: status plus ``calls``, a list of
    ``[plain.dumps([args, kwargs]), {"o": output} | {"x": exception type}]``."""
    import random

    limit, timeout, entry = job["max_message_chars"], job["test_timeout_s"], job["entry_point"]
    ns: dict = {"__name__": "__sandbox__"}
    load = _loader(ns, timeout, limit)
    err = load(job["program"], "<program>") or load(job.get("setup", ""), "<setup>")
    os.write(
        wfd, (json.dumps({"k": "program", **(err or {"s": "passed", "e": None, "m": ""})}) + "\n").encode()
    )
    for i, source in enumerate(job["tests"]) if err is None else ():
        calls: list = []
        fn = ns[entry]

        def candidate(*args, _fn=fn, _calls=calls, **kwargs):
            key = plain.dumps([list(args), kwargs])
            try:
                out = _fn(*args, **kwargs)
            except BaseException as e:
                _calls.append([key, {"x": type(e).__name__}])
                raise
            _calls.append([key, {"o": plain.encode(out)}])
            return out

        local = dict(ns, candidate=candidate, **{entry: candidate})
        random.seed(job["seed"])
        res = _loader(local, timeout, limit)(source, f"<test {i}>") or {"s": "passed", "e": None, "m": ""}
        if res["e"] == "AssertionError":
            res["s"] = "failed"
        os.write(wfd, (json.dumps({"k": "test", "i": i, **res, "calls": calls}) + "\n").encode())
    os.write(wfd, b'{"k": "done"}\n')
    _flush_and_exit()


def _flush_and_exit() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(0)


def main(argv: list[str]) -> None:
    """Bubblewrap entry: ``harness.py JOB_FD RESULT_FD READY_FD``; the job is JSON on ``JOB_FD``;
    ``K`` on ``READY_FD`` (closed before any untrusted code runs) says the sandbox came up."""
    with os.fdopen(int(argv[1]), "rb") as f:
        job = json.loads(f.read())
    os.chdir(job.get("workdir") or "/tmp")
    os.write(int(argv[3]), b"K")
    os.close(int(argv[3]))
    dispatch(job, int(argv[2]))


def _line(source: str, lineno: int) -> str:
    lines = source.splitlines()
    return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""


def _statement_at(source: str, lineno: int) -> str:
    """The source of the innermost ``assert`` statement spanning ``lineno`` (else that line)."""
    try:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Assert) and node.lineno <= lineno <= (node.end_lineno or node.lineno):
                return " ".join((ast.get_source_segment(source, node) or "").split())
    except (SyntaxError, ValueError):
        pass
    return _line(source, lineno)


def parse_records(lines: list[str], nonce: str, num_tests: int, statuses: tuple[str, ...]):
    """Validate the record stream (parent side): the nonce on every line, in the order
    ``iso* program test(0..n-1)* done?``, known statuses.

    Returns:
        ``(program record or None, test records, isolation items)``.

    Raises:
        ValueError: a forged, malformed or out-of-order record.
    """
    program, tests, isolation, done = None, [], [], False
    for line in lines:
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or rec.get("n") != nonce or done:
                raise ValueError("record without the nonce or after done")
            kind, ok = rec.get("k"), program is not None and program.get("s") == "passed"
            if kind in ("program", "test") and rec.get("s") not in statuses:
                raise ValueError(f"unknown status {rec.get('s')!r}")
            if kind == "iso" and program is None:
                isolation += [str(x) for x in rec["items"]]
            elif kind == "program" and program is None:
                program = rec
            elif kind == "test" and ok and rec.get("i") == len(tests) < num_tests:
                tests.append(rec)
            elif kind == "done" and program is not None and (not ok or len(tests) == num_tests):
                done = True
            else:
                raise ValueError(f"unexpected record {kind!r}")
        except (KeyError, TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"malformed record: {err}") from None
    return program, tests, isolation


if __name__ == "__main__":
    main(sys.argv)
