"""The test harness of the sandbox: runs the untrusted program, the setup and each test.

Loaded by :mod:`comlrl_lightning.sandbox.runner` (standard library only) and called in the worker
process after the isolation is in place. Writes one JSON record per step to the result pipe:
``{"k": "program"|"test"|"done", "i": test index, "s": status, "e": error type, "m": message,
"d": seconds, "n": nonce}``; the parent (:mod:`comlrl_lightning.sandbox.api`) validates the stream
with :func:`parse_records`.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import sys
import time
import traceback
import types


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
    write, dumps, mono, setitimer, exc_only = os.write, json.dumps, time.monotonic, signal.setitimer, (
        traceback.format_exception_only
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
