"""Split runs: the entry point and its helper ``aux`` in two sandboxes, joined by a trusted broker.

:func:`run_split` starts the entry point's program (``calls`` mode, with ``aux`` bound to
:func:`channel.stub`) and the helper's program (``serve`` mode), each with every guarantee of
:func:`~comlrl_lightning.coding.sandbox.calls.run_calls` (own launcher, cgroup, uid, namespaces,
seccomp, scratch ``/tmp``). The broker (a thread of this, trusted, process) reads each request of
the entry point's process, decodes it as plain data (:mod:`.plain`), forwards it to the helper's
process, decodes the answer, passes it through ``substitute`` (the cooperation bonus's stand-ins,
:mod:`comlrl_lightning.coding.standin`; they exist nowhere else) and sends the result back.
The helper always runs on the entry point's actual arguments, in every run, so a stand-in's
answer takes as long as the real one; what each call took is not part of any verdict.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Sequence

from comlrl_lightning.coding.sandbox import plain
from comlrl_lightning.coding.sandbox.calls import CallsReport, collect_calls
from comlrl_lightning.coding.sandbox.channel import ENTRY
from comlrl_lightning.coding.sandbox.launch import launch
from comlrl_lightning.coding.sandbox.results import SandboxConfig

Substitute = Callable[[list, dict, dict, bool], dict]
"""``substitute(args, kwargs, real output, entered)`` -> the output the entry point gets
(outputs as ``{"o": value}``, ``{"x": exception type}`` or ``{"t": category}``); ``entered``:
the call came after the harness's :data:`channel.ENTRY` (main has loaded)."""


class _Reader:
    """Lines from a pipe, waiting at most until a deadline (``None``: time is up or end of file)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.eof = fd, b"", False

    def line(self, deadline: float, stop: threading.Event | None = None) -> bytes | None:
        while b"\n" not in self.buf:
            if self.eof or len(self.buf) > (8 << 20) or (stop is not None and stop.is_set()):
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.05))
            if ready:
                chunk = os.read(self.fd, 1 << 16)
                self.eof = not chunk
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line


def _send(fd: int, data: bytes, deadline: float) -> bool:
    view = memoryview(data)
    while view:
        if time.monotonic() > deadline:
            return False
        _, ready, _ = select.select([], [fd], [], 0.05)
        if ready:
            try:
                view = view[os.write(fd, view) :]
            except (BlockingIOError, BrokenPipeError):
                return False
    return True


class _Broker:
    """The trusted relay between the two processes of one split run."""

    def __init__(self, helper_job: dict, cfg: SandboxConfig, substitute: Substitute | None) -> None:
        self.m_req_r, self.m_req_w = os.pipe()  # entry point -> broker
        self.m_resp_r, self.m_resp_w = os.pipe()  # broker -> entry point
        self.h_req_r, self.h_req_w = os.pipe()  # broker -> helper
        self.h_resp_r, self.h_resp_w = os.pipe()  # helper -> broker
        for fd in (self.m_resp_w, self.h_req_w):
            os.set_blocking(fd, False)
        self.cfg, self.substitute = cfg, substitute
        self.helper_job = {**helper_job, "mode": "serve", "channel": [self.h_req_r, self.h_resp_w]}
        self.helper_thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.helper_error: BaseException | None = None
        self.stop = threading.Event()
        self.log: list[tuple[list, dict, dict]] = []  # (args, kwargs, the helper's real output)
        self.helper_timeouts = 0
        self.entries = 0  # ENTRY lines seen: 1 in an honest run (more: main sent one too)

    def start_helper(self) -> None:
        with self.lock:
            if self.helper_thread is not None:
                return
            self.helper_thread = threading.Thread(target=self._run_helper, daemon=True)
            self.helper_thread.start()

    def _run_helper(self) -> None:
        try:
            launch(self.helper_job, self.cfg, pass_fds=(self.h_req_r, self.h_resp_w))
        except BaseException as err:  # noqa: BLE001 - re-raised by run_split
            self.helper_error = err

    def serve(self, deadline: float) -> None:
        m_in, h_in, k = _Reader(self.m_req_r), _Reader(self.h_resp_r), 0
        per_call = self.cfg.test_timeout_s + 0.5  # the helper's own timer answers before this
        while not self.stop.is_set():
            line = m_in.line(deadline, self.stop)
            if line is None:
                return
            if line + b"\n" == ENTRY:
                self.entries += 1
                continue
            try:
                n, args, kwargs = plain.loads(line)
            except (plain.PlainDataError, TypeError, ValueError):
                continue
            if type(n) is not int or type(args) is not list or type(kwargs) is not dict:
                continue
            self.start_helper()
            k += 1
            real = {"t": "timeout"}
            if _send(self.h_req_w, (plain.dumps([k, args, kwargs]) + "\n").encode(), deadline):
                wait = min(deadline, time.monotonic() + per_call)
                while (answer := h_in.line(wait)) is not None:
                    try:
                        got, out = plain.loads(answer)
                    except (plain.PlainDataError, TypeError, ValueError):
                        continue
                    if got == k:
                        real = _checked(out)
                        break
            self.helper_timeouts += "t" in real and real["t"] == "timeout"
            entered = self.entries > 0
            if entered:  # calls made while main loads are no evidence of the helper's work
                self.log.append((args, kwargs, real))
            out = real if self.substitute is None else self.substitute(args, kwargs, real, entered)
            if not _send(self.m_resp_w, (plain.dumps([n, out]) + "\n").encode(), deadline):
                return

    def wake(self) -> None:
        """Ends the relay's wait for a request at once (an empty line, which decodes to nothing),
        not at its next poll: the wait would otherwise add up to 50 ms to every run."""
        os.set_blocking(self.m_req_w, False)
        try:
            os.write(self.m_req_w, b"\n")
        except (BlockingIOError, BrokenPipeError):
            pass  # a full pipe: the relay is reading it and sees `stop` after this line

    def close(self) -> None:
        self.stop.set()
        for fd in (self.m_req_r, self.m_req_w, self.m_resp_r, self.m_resp_w, self.h_req_w, self.h_resp_r):
            os.close(fd)  # the helper's process reads end of file and exits
        if self.helper_thread is not None:
            self.helper_thread.join()
        os.close(self.h_req_r)
        os.close(self.h_resp_w)


def _checked(out: object) -> dict:
    """A helper answer as the broker passes it on: one of the three forms, else ``unsupported``."""
    if type(out) is dict and len(out) == 1:
        if "o" in out:
            return out
        if type(out.get("x")) is str:
            return {"x": out["x"][:100]}
        if out.get("t") in ("timeout", "unsupported"):
            return out
    return {"t": "unsupported"}


def run_split(
    program: str,
    helper: str,
    entry_point: str,
    calls: Sequence[str],
    *,
    main: str = "",
    protected: Sequence[str] = (),
    aux: str = "aux",
    substitute: Substitute | None = None,
    budgets: Sequence[float] | None = None,
    eager: bool = True,
    config: SandboxConfig | None = None,
) -> CallsReport:
    """:func:`~comlrl_lightning.coding.sandbox.calls.run_calls` of ``program`` then ``main`` with ``aux``
    in another sandbox running ``helper`` (see the module docstring).

    Args:
        program, entry_point, calls, main, protected: as for ``run_calls`` (``aux`` is protected:
            main cannot rebind the stub).
        helper: the helper's program (it must define ``aux``).
        substitute: maps each real helper output to the one the entry point gets (``None``: the
            real one).
        budgets: per-call time limits of the entry point (at most ``config.test_timeout_s``).
        eager: start the helper's sandbox with the entry point's; else on the first call.

    Returns:
        The entry point's :class:`CallsReport`, with ``aux_calls`` (each call made after
        :data:`channel.ENTRY`: its arguments and the helper's real output), ``helper_timeouts``
        and ``entries`` (how many ENTRY lines the broker saw) filled in.

    Raises:
        SandboxError: either sandbox could not be started or crashed.
    """
    cfg = config or SandboxConfig()
    broker = _Broker({"program": helper, "aux": aux}, cfg, substitute)
    fields = {
        "mode": "calls",
        "program": program,
        "main": main,
        "protected": sorted(set(protected) | {aux}),
        "entry_point": entry_point,
        "calls": list(calls),
        "channel": [broker.m_resp_r, broker.m_req_w],
        "aux": aux,
        "budgets": list(budgets or []),
    }
    deadline = time.monotonic() + cfg.timeout_s + cfg.startup_grace_s
    relay = threading.Thread(target=broker.serve, args=(deadline,), daemon=True)
    relay.start()
    if eager:
        broker.start_helper()
    try:
        raw = launch(fields, cfg, pass_fds=(broker.m_resp_r, broker.m_req_w))
    finally:
        broker.stop.set()
        broker.wake()
        relay.join()
        broker.close()
    if broker.helper_error is not None:
        raise broker.helper_error
    report = collect_calls(raw, cfg, len(calls))
    report.aux_calls, report.helper_timeouts = list(broker.log), broker.helper_timeouts
    report.entries = broker.entries
    return report
