"""The trusted judge: replays a problem's tests with ``candidate`` a lookup of recorded outputs.

Design (issue "Code rewards you can trust"): the process that runs generated code never holds
an expected value, a test, a verdict or anything a verdict is derived from.

1. **Record** (:mod:`comlrl_lightning.coding.recorder`, once per problem, cached): each test
   of the problem's ``check`` runs in a sandbox with the canonical solution wrapped in a
   recorder, after ``random.seed(seed)``; the recorder keeps the inputs of every call
   (``plain.dumps([args, kwargs])``, taken before the call).
2. **Run** (:func:`comlrl_lightning.coding.sandbox.api.run_calls`): the candidate's program is called on
   those inputs in the untrusted sandbox; only its outputs come back, as plain data (exact builtin
   types, size-capped; another type, a subclass of a builtin or an oversized value is an
   ``UnsupportedOutput`` failure).
3. **Judge** (this module): a separate process that runs trusted code only (the prompt's preamble,
   the test module, the test statement) replays each test after the same ``random.seed(seed)``,
   with ``candidate`` a lookup from call inputs to the candidate's outputs (a fresh copy per
   call). A call the candidate raised on raises :class:`CandidateFailed`; an input that was not
   recorded (the test took another path) raises ``CallMismatch``; both fail the test.

The judge process is started once per :class:`Judge` (``python -s -S -P judge.py``, standard
library only) and answers JSON lines on its stdin/stdout; it is restarted when it overruns its
deadline. Nothing of the candidate runs in it: outputs arrive as JSON and are decoded by
:func:`comlrl_lightning.coding.sandbox.plain.decode` with the same caps.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

_PLAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox", "plain.py")
_spec = importlib.util.spec_from_file_location("judge_plain", _PLAIN)
plain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plain)


class CandidateFailed(Exception):
    """Raised in place of a candidate's output when the candidate raised (args: its type name)."""


class CandidateTimeout(Exception):
    """Raised in place of a candidate's output when the call ran over its time (harness category)."""


class CallMismatch(Exception):
    """The test called ``candidate`` on an input the recording does not have."""


class _JudgeTimeout(BaseException):
    pass


def replay(
    setup: str,
    tests: Sequence[str],
    outputs: dict[str, object],
    seed: int,
    timeout_s: float,
    entry_point: str = "candidate",
) -> list[list[str | None]]:
    """Run each test with ``candidate`` (and ``entry_point``, as in HumanEval's own harness) looking ``plain.dumps([args, kwargs])`` up in ``outputs``
    (``{"o": encoded value}``, ``{"x": exception type}`` or ``{"t": "timeout" | "unsupported"}``). Returns ``[status, error type]`` per
    test: ``passed``, ``failed`` (an assertion), ``error`` (the candidate raised, a mismatch, an
    unsupported output) or ``timeout``. Runs inside the judge process."""
    import random

    def candidate(*args, **kwargs):
        try:
            key = plain.dumps([list(args), kwargs])
        except plain.PlainDataError:
            raise CallMismatch("a non-plain input") from None
        out = outputs.get(key)
        if out is None:
            raise CallMismatch(key[:80])
        if out.get("t") == "timeout":
            raise CandidateTimeout()
        if "o" not in out:  # {"x": exception type} or {"t": "unsupported"}
            raise CandidateFailed(str(out["x"]) if "x" in out else "UnsupportedOutput")
        try:
            return plain.decode(out["o"])
        except plain.PlainDataError:
            raise CandidateFailed("UnsupportedOutput") from None

    def on_alarm(signum, frame):
        raise _JudgeTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    base: dict = {"__name__": "__judge__"}
    exec(compile(setup, "<setup>", "exec"), base)  # trusted: preamble of the prompt and the test module
    results = []
    for i, source in enumerate(tests):
        ns = dict(base, candidate=candidate, **{entry_point: candidate})
        random.seed(seed)
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                exec(compile(source, f"<test {i}>", "exec"), ns)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            results.append(["passed", None])
        except (_JudgeTimeout, CandidateTimeout):
            results.append(["timeout", "Timeout"])
        except AssertionError:
            results.append(["failed", "AssertionError"])
        except CandidateFailed as err:
            results.append(["error", str(err.args[0])[:100] if err.args else "CandidateFailed"])
        except CallMismatch:
            results.append(["error", "CallMismatch"])
        except BaseException as err:  # noqa: BLE001 - e.g. a TypeError on a wrong output type
            results.append(["error", type(err).__name__])
    return results


def _serve() -> None:
    """Judge process loop: one JSON request per stdin line, one JSON answer per stdout line."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # plain outputs are capped far below this
    out = sys.stdout
    for line in sys.stdin:
        try:
            req = json.loads(line)
            res = {
                "results": replay(
                    req["setup"],
                    req["tests"],
                    req["outputs"],
                    req["seed"],
                    req["timeout_s"],
                    req["entry_point"],
                )
            }
        except BaseException as err:  # noqa: BLE001 - a broken request is answered, not fatal
            res = {"error": f"{type(err).__name__}: {err}"[:500]}
        out.write(json.dumps(res) + "\n")
        out.flush()


class JudgeError(RuntimeError):
    """The judge process failed on a request (not the candidate's fault)."""


class Judge:
    """A pool of judge processes (one per concurrent caller, started lazily), thread-safe.

    Args:
        timeout_s: limit per test in seconds (inside the judge); a request overrunning
            ``timeout_s * (tests + 1) + 5`` seconds kills that judge process (a new one starts).
    """

    def __init__(self, timeout_s: float = 2.0) -> None:
        self.timeout_s = timeout_s
        self._idle: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def judge(
        self,
        setup: str,
        tests: Sequence[str],
        outputs: dict[str, object],
        seed: int = 0,
        entry_point: str = "candidate",
    ) -> list[list[str | None]]:
        """``[status, error type]`` per test (see :func:`replay`).

        Raises:
            JudgeError: the judge crashed or rejected the request.
        """
        req = (
            json.dumps(
                {
                    "setup": setup,
                    "tests": list(tests),
                    "outputs": outputs,
                    "seed": seed,
                    "timeout_s": self.timeout_s,
                    "entry_point": entry_point,
                }
            )
            + "\n"
        )
        proc = self._take()
        timer = threading.Timer(self.timeout_s * (len(tests) + 1) + 5, proc.kill)
        timer.start()
        try:
            proc.stdin.write(req)
            proc.stdin.flush()
            line = proc.stdout.readline()
        except OSError:
            line = ""
        finally:
            timer.cancel()
        if not line:  # killed on its deadline or crashed: every test of the request timed out
            proc.kill()
            proc.wait()
            return [["timeout", "JudgeTimeout"] for _ in tests]
        with self._lock:
            self._idle.append(proc)
        res = json.loads(line)
        if "error" in res:
            raise JudgeError(f"judge failed: {res['error']}")
        return res["results"]

    def _take(self) -> subprocess.Popen:
        with self._lock:
            while self._idle:
                proc = self._idle.pop()
                if proc.poll() is None:
                    return proc
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}
        return subprocess.Popen(
            [sys.executable, "-s", "-S", "-P", os.path.abspath(__file__), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
            close_fds=True,
        )

    def close(self) -> None:
        """Stop the judge processes."""
        with self._lock:
            procs, self._idle = self._idle, []
        for proc in procs:
            proc.kill()
            proc.wait()

    def __getstate__(self) -> dict:
        return {"timeout_s": self.timeout_s, "_idle": [], "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
