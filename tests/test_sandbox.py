"""The sandbox against each hazard of untrusted generated code (see comlrl_lightning.coding.sandbox.api)."""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from comlrl_lightning.coding.sandbox.api import SandboxConfig, SandboxPool, TestJob, run_tests

ROOT = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0
FAST = SandboxConfig(timeout_s=3.0, test_timeout_s=1.0, memory_mb=512)
ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def _no_processes_of(uid: int | None, wait_s: float = 3.0) -> None:
    """Nothing of the run is left: no child of ours, no process of the sandbox uid (a zombie handed
    to PID 1 when the launcher itself was killed gets ``wait_s`` to be reaped by it)."""
    assert not psutil.Process().children(recursive=True), "sandbox processes left under the test process"
    deadline = time.monotonic() + wait_s
    while uid is not None:
        left = [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
        if not left:
            break
        assert time.monotonic() < deadline, f"processes of sandbox uid {uid} left: {left}"
        time.sleep(0.05)


def test_correct_program_passes():
    report = run_tests(ADD, ADD_TESTS, config=FAST)
    assert report.program_loaded and report.all_passed
    assert (report.num_passed, report.num_tests, report.fraction_passed) == (3, 3, 1.0)
    assert [t.status for t in report.tests] == ["passed"] * 3
    assert report.program.returncode == 0 and not report.tampered


def test_wrong_program_fails_with_the_assertion_in_the_message():
    report = run_tests("def add(a, b):\n    return a * b\n", ADD_TESTS, config=FAST)
    assert [t.status for t in report.tests] == ["failed", "failed", "passed"]
    assert report.tests[0].error_type == "AssertionError"
    assert "assert add(1, 2) == 3" in report.tests[0].message
    assert report.num_passed == 1 and report.fraction_passed == pytest.approx(1 / 3) and not report.all_passed


def test_other_exceptions_are_errors_and_syntax_errors_fail_to_load():
    report = run_tests(ADD, ["assert missing(1) == 1", "assert add(1, 2) == 3"], config=FAST)
    assert report.tests[0].status == "error" and report.tests[0].error_type == "NameError"
    assert "missing" in report.tests[0].message and report.tests[1].passed
    report = run_tests("def add(a, b)\n    return a + b\n", ADD_TESTS, config=FAST)
    assert not report.program_loaded
    assert (report.program.status, report.program.error_type) == ("error", "SyntaxError")
    assert all(t.status == "error" and t.error_type == "SyntaxError" for t in report.tests)
    assert report.num_passed == 0


def test_infinite_loop_times_out_within_the_limit():
    t0 = time.monotonic()
    report = run_tests("while True:\n    pass\n", ["assert True"], config=FAST, timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert report.program.status == "timeout" and report.tests[0].status == "timeout"
    assert 1.0 <= elapsed < 1.0 + 1.5, elapsed
    # A hanging test only costs that test (per-test timer); the others still run.
    report = run_tests(
        ADD,
        ["assert add(1, 2) == 3", "while True: pass", "assert add(2, 2) == 4"],
        config=FAST,
        test_timeout_s=0.3,
    )
    assert [t.status for t in report.tests] == ["passed", "timeout", "passed"]


@pytest.mark.parametrize("namespaces", [True, False])
def test_fork_bomb_is_bounded_and_leaves_no_process(namespaces):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    report = run_tests(
        bomb, ["assert True"], config=FAST, timeout_s=1.5, max_processes=16, namespaces=namespaces
    )
    assert time.monotonic() - t0 < 1.5 + 1.5
    assert report.program.status in ("timeout", "killed") and report.num_passed == 0
    _no_processes_of(report.sandbox_uid)
    assert sum(i * i for i in range(100_000)) == 333328333350000  # the parent still computes
    assert run_tests(ADD, ADD_TESTS, config=FAST).all_passed  # and the sandbox still works


@pytest.mark.parametrize("namespaces", [True, False])
def test_setsid_orphan_is_reaped(namespaces):
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    report = run_tests(escape + ADD, ADD_TESTS, config=FAST, namespaces=namespaces)
    assert report.all_passed
    if IS_ROOT or namespaces:
        _no_processes_of(report.sandbox_uid)


def test_cpu_limit_kills_and_a_stuck_launcher_is_killed_by_the_parent():
    loop = "while True:\n    pass\n"
    report = run_tests(loop, [], config=FAST, cpu_time_s=1, timeout_s=10, test_timeout_s=9)
    assert (report.program.status, report.program.error_type) == ("killed", "SIGXCPU")
    t0 = time.monotonic()  # parent deadline (timeout + grace) before the launcher's own deadline
    report = run_tests(
        "while True:\n    pass\n", ["assert True"], config=FAST, timeout_s=0.5, startup_grace_s=0.01
    )
    assert report.program.status == "timeout" and report.tests[0].status == "timeout"
    assert time.monotonic() - t0 < 1.5
    _no_processes_of(report.sandbox_uid)


@pytest.mark.parametrize("retry_ok", [True, False])
def test_a_cleanup_that_overruns_is_retried_not_raised_out_of_the_reward(monkeypatch, caplog, retry_ok):
    # at load 32 the fresh cleanup process (launcher overran, unique uid) took over 30 s and its
    # TimeoutExpired escaped the reward call, which would have crashed a training step
    import subprocess

    from comlrl_lightning.coding.sandbox import launch

    calls = []

    def run(cmd, **kw):
        calls.append(kw["timeout"])
        if len(calls) == 2 and retry_ok:
            return subprocess.CompletedProcess(cmd, 0)
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    class Proc:
        pid = 2**22 + 7  # no such process group: the kill is refused, as for a launcher already gone

        def wait(self):
            return -9

    class Inline:  # the background retry, run at once
        def __init__(self, target, args, daemon):
            self.run = lambda: target(*args)

        def start(self):
            self.run()

    monkeypatch.setattr(launch.subprocess, "run", run)
    monkeypatch.setattr(launch.threading, "Thread", Inline)
    monkeypatch.setattr(launch, "CLEANUP_FAILURES", [])
    with caplog.at_level("WARNING", logger=launch.__name__):
        launch._kill_stuck(Proc(), "/nonexistent", 2_000_000_123, ["/sys/fs/cgroup/none"])
    assert calls == [30, launch.CLEANUP_RETRY_S]
    assert "sandbox cleanup overran 30 s (uid 2000000123" in caplog.text
    if retry_ok:
        assert "done on retry" in caplog.text and launch.CLEANUP_FAILURES == []
    else:
        assert "failed twice" in caplog.text
        assert launch.CLEANUP_FAILURES == [(2_000_000_123, ["/sys/fs/cgroup/none"])]


def test_huge_allocation_is_an_error_not_a_crash():
    report = run_tests("x = bytearray(8 * 1024 ** 3)\n", ["assert True"], config=FAST, memory_mb=256)
    assert (report.program.status, report.program.error_type) == ("error", "MemoryError")
    grow = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 * 1024))\n"
    report = run_tests(grow, ["assert True"], config=FAST, memory_mb=256, timeout_s=8, test_timeout_s=6)
    assert report.program.status in ("error", "killed") and report.num_passed == 0
    assert report.program.error_type in ("MemoryError", "SIGKILL")


def test_output_flood_is_bounded():
    flood = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    report = run_tests(flood, [], config=FAST, file_size_mb=2)
    assert report.program.status == "error" and "File too large" in report.program.message
    assert len(report.stdout) <= FAST.max_output_chars


def test_killing_the_parent_does_not_reach_training():
    isolation = run_tests("", [], config=FAST).isolation
    if "pid-namespace" not in isolation and not any(i.startswith("uid=") for i in isolation):
        pytest.skip(f"neither a PID namespace nor a separate uid on this OS: {isolation}")
    me = os.getpid()
    code = (
        "import os, signal\nresults = {}\n"
        f"for name, target in (('parent', os.getppid()), ('training', {me}), ('init', 1)):\n"
        "    try:\n        os.kill(target, signal.SIGKILL)\n        results[name] = 'sent'\n"
        "    except OSError as err:\n        results[name] = type(err).__name__\n"
        f"try:\n    os.killpg(os.getpgid({me}), signal.SIGKILL)\nexcept OSError:\n    pass\n"
    )
    report = run_tests(
        code, ["assert results['training'] in ('ProcessLookupError', 'PermissionError')"], config=FAST
    )
    assert psutil.pid_exists(me) and report.all_passed  # refused; and the launcher survived to report
    # Without namespaces or uid change the code's parent is the intermediate init, never training:
    # the kill lands there, and the run still returns a well-formed report.
    report = run_tests(
        "import os, signal\nPARENT = os.getppid()\nos.kill(PARENT, signal.SIGKILL)\n",
        [f"assert PARENT != {me}"],
        config=FAST,
        namespaces=False,
        drop_privileges=False,
    )
    assert report.program.status in ("passed", "killed") and report.tests[0].status in ("passed", "killed")
    assert psutil.pid_exists(me)


@pytest.mark.parametrize("namespaces", [True, False])
def test_writes_outside_the_working_directory_do_not_persist(namespaces):
    token = secrets.token_hex(6)
    targets = [
        ROOT / f"pwned_{token}",
        Path(tempfile.gettempdir()) / f"x_{token}",
        Path("/tmp") / f"y_{token}",
        Path("/dev/shm") / f"z_{token}",
    ]
    code = (
        "import os\nprint(os.getcwd())\n"
        + "".join(
            f"try:\n    open({str(t)!r}, 'w').write('pwned')\nexcept OSError:\n    pass\n" for t in targets
        )
        + "open('inside.txt', 'w').write('ok')\n"
    )
    try:
        test = "assert open('inside.txt').read() == 'ok'"
        report = run_tests(code, [test], config=FAST, namespaces=namespaces)
        assert report.all_passed, report
        if IS_ROOT:  # a dropped uid cannot write root's files; private or cleaned-up /tmp, /dev/shm
            assert [t for t in targets if t.exists()] == []
        cwd = Path(report.stdout.strip().splitlines()[0])
        assert cwd.is_absolute() and not (cwd / "inside.txt").exists()  # the scratch directory is private
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_exit_before_or_during_the_tests_is_not_a_pass():
    exits = (("import sys; sys.exit(0)", "SystemExit"), ("import os; os._exit(0)", "EarlyExit"))
    for exit_call, error_type in exits:
        report = run_tests(ADD + exit_call + "\n", ADD_TESTS, config=FAST)
        assert not report.program_loaded and report.num_passed == 0, exit_call
        assert report.program.error_type == error_type and report.tests[0].error_type == error_type
    tests = ["assert add(1, 2) == 3", "import os; os._exit(0)", "assert add(2, 2) == 4"]
    report = run_tests(ADD, tests, config=FAST)
    assert [t.status for t in report.tests] == ["passed", "error", "error"]
    assert report.tests[1].error_type == "EarlyExit" and not report.all_passed


def test_forged_result_markers_are_not_passes():
    fake = '{"k": "test", "i": 0, "s": "passed", "e": null, "m": "", "d": 0.0}'
    printed = f"def add(a, b):\n    return 0\nprint({fake!r})\nprint({fake!r}.replace('0,', '1,'))\n"
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
    report = run_tests(printed, tests, config=FAST)
    assert report.num_passed == 0 and not report.tampered
    assert [t.status for t in report.tests] == ["failed", "failed"]
    written = (
        "import os\ndef add(a, b):\n    return 0\n"
        f"for fd in range(3, 64):\n    try:\n        os.write(fd, ({fake!r} + '\\n').encode())\n"
        "    except OSError:\n        pass\n"
    )
    report = run_tests(written, tests, config=FAST)
    assert report.tampered and report.num_passed == 0 and report.tests[0].error_type == "ResultTampering"


def test_network_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.3)
    port = server.getsockname()[1]
    try:
        report = run_tests(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n", [], config=FAST
        )
        assert (report.program.status, report.program.error_type) == ("error", "PermissionError")
        raw = f"import _socket\ns = _socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))\n"
        report = run_tests(raw, [], config=FAST)  # bypasses the in-process patch
        if "network-namespace" in report.isolation:  # only its own loopback, or none at all
            assert report.program.status == "error"
            assert report.program.error_type in ("OSError", "ConnectionRefusedError"), report.program
            with pytest.raises(socket.timeout):
                server.accept()  # nothing ever connected
    finally:
        server.close()


def test_pool_runs_in_parallel_and_keeps_order():
    jobs = [
        TestJob(f"import time\ntime.sleep(0.6)\nVALUE = {i}\n", [f"assert VALUE == {i}", "assert VALUE == 2"])
        for i in range(4)
    ]
    with SandboxPool(max_workers=4, config=FAST) as pool:
        t0 = time.monotonic()
        reports = pool.run(jobs)
        wall = time.monotonic() - t0
        assert [r.tests[0].passed for r in reports] == [True] * 4
        assert [r.tests[1].passed for r in reports] == [False, False, True, False]  # order kept
        serial = sum(r.duration_s for r in reports)
        assert wall < 0.75 * serial, (wall, serial)
        mapped = pool.map([ADD, "def add(a, b):\n    return 0\n"], [ADD_TESTS, ADD_TESTS])
        assert [r.num_passed for r in mapped] == [3, 1]  # add(-1, 1) == 0 holds
    with pytest.raises(ValueError, match="lengths must match"):
        SandboxPool(1).map([ADD], [])


def test_a_broken_sandbox_raises_instead_of_scoring_zero(monkeypatch):
    import comlrl_lightning.coding.sandbox.api as sandbox
    import comlrl_lightning.coding.sandbox.launch as launch

    run_tests(ADD, ADD_TESTS, config=FAST)  # the backend probe runs with the real launcher
    monkeypatch.setattr(launch, "_RUNNER", "/nonexistent/sandbox_runner.py")
    with pytest.raises(sandbox.SandboxError, match="without a result"):
        run_tests(ADD, ADD_TESTS, config=FAST)


def test_config_is_validated():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="uid"):
        SandboxConfig(uid=0)
    with pytest.raises(ValueError, match="unknown field"):
        run_tests(ADD, [], timeout=1)
