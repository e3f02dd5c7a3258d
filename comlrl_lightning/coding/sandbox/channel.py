"""The call channel between two sandboxed interpreters: ``main`` reaches ``aux`` only through it.

Standard library only; loaded by path by the harness in both sandboxes. The entry point's
process (``main``) gets :func:`stub` bound as ``aux``: each call sends ``[n, args, kwargs]`` as
plain data (:mod:`plain`: numbers, strings, bytes, None, bools, lists / tuples / dicts / sets of
them; anything else fails that call with a ``TypeError`` before anything is sent) and waits for
the answer to call ``n``. The helper's process runs :func:`serve`: it loads the helper, then
answers each request with ``aux``'s plain output. Between them sits a trusted broker in the
training process (:mod:`comlrl_lightning.coding.sandbox.split`), which decodes every line, applies the
cooperation bonus's stand-ins and re-encodes, so neither process can send the other anything but
plain values, and neither shares globals, files, output or a process with the other.
"""

from __future__ import annotations

import builtins
import os
import signal

MAX_LINE = 8 << 20
"""Longest line (bytes) either side reads; a longer one fails the call."""
ENTRY = b'"entry"\n'
"""The line the entry point's harness sends once, after ``main`` has loaded and before the
first entry call: the broker counts the helper's calls per phase from it (calls made while main
loads are never the replayed answer nor evidence of work). Main shares the harness's process and
could send this line too: the broker then sees it more than once and the run is no evidence."""


class _Lines:
    """Lines from a file descriptor (``None`` at end of file or past :data:`MAX_LINE`)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, b""

    def line(self) -> bytes | None:
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line


def _raised(name: str) -> BaseException:
    """The exception ``main`` sees when ``aux`` raised ``name``: the builtin of that name when there
    is one (``except ValueError`` works as in one interpreter), else an ``Exception`` so named."""
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind()
    return type(name, (Exception,), {})()


def stub(rfd: int, wfd: int, plain, on_timeout):
    """``aux`` for the entry point's process: requests on ``wfd``, answers read from ``rfd``.
    ``on_timeout()`` is raised when the helper ran out of its time (the harness's own category)."""
    lines, seq, write, dumps, loads = _Lines(rfd), [0], os.write, plain.dumps, plain.loads

    def aux(*args, **kwargs):
        seq[0] += 1
        n = seq[0]
        try:
            msg = dumps([n, list(args), kwargs]).encode()
        except (plain.PlainDataError, RecursionError):
            raise TypeError("aux takes and returns plain values only") from None
        write(wfd, msg + b"\n")
        while True:  # answers to calls this process gave up on (its own timer) are skipped
            line = lines.line()
            if line is None:
                raise RuntimeError("aux is not available")
            try:
                got, out = loads(line)
            except (plain.PlainDataError, TypeError, ValueError):
                raise RuntimeError("aux is not available") from None
            if got == n:
                break
        if type(out) is dict and "o" in out:
            return out["o"]
        if type(out) is dict and out.get("t") == "timeout":
            raise on_timeout()
        if type(out) is dict and type(out.get("x")) is str:
            raise _raised(out["x"])
        raise TypeError("aux returned a value that is not plain data")

    return aux


def serve(job: dict, wfd: int, load, step_timeout_exc, flush_and_exit, plain) -> None:
    """The helper's process: load ``job["program"]``, report it on ``wfd`` (``{"k": "program"}``),
    then answer each request on ``job["channel"][0]`` on ``job["channel"][1]`` until end of file:
    ``[n, {"o": output}]``, ``[n, {"x": exception type}]`` or ``[n, {"t": "timeout" |
    "unsupported"}]``; each call has ``job["test_timeout_s"]``."""
    import json

    rfd, out_fd = job["channel"]
    timeout, setitimer, _type = job["test_timeout_s"], signal.setitimer, type
    encode, loads = plain.encode, plain.loads
    ns: dict = {"__name__": "__sandbox__"}
    err = load(ns)(job["program"], "<program>")
    fn = ns.get(job.get("aux", "aux")) if err is None else None
    os.write(
        wfd, (json.dumps({"k": "program", **(err or {"s": "passed", "e": None, "m": ""})}) + "\n").encode()
    )
    lines = _Lines(rfd)
    while True:
        line = lines.line()
        if line is None:
            break
        try:
            n, args, kwargs = loads(line)
        except (plain.PlainDataError, TypeError, ValueError):
            continue  # the broker only forwards well-formed requests
        try:
            if not callable(fn):
                raise NameError("aux")
            setitimer(signal.ITIMER_REAL, timeout)
            try:
                res = fn(*args, **kwargs)
            finally:
                setitimer(signal.ITIMER_REAL, 0)
            encode(res)  # raises for a value that is not plain
            rec = {"o": res}
        except step_timeout_exc:
            rec = {"t": "timeout"}
        except plain.PlainDataError:
            rec = {"t": "unsupported"}
        except BaseException as e:  # noqa: BLE001 - the helper's failure is its output
            rec = {"x": str(_type(e).__name__)[:100]}
        try:
            os.write(out_fd, (plain.dumps([n, rec]) + "\n").encode())
        except BaseException:  # noqa: BLE001 - e.g. the broker has gone
            break
    flush_and_exit()
